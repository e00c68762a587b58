# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 04 · From the notebook to `torchrun`
#
# The handles of notebooks 02 and 03 know nothing about notebooks: they need only a
# `torch.distributed` group. When a fit outgrows a notebook (it runs for hours, needs more
# machines, or must run as a batch job), the same code runs from a terminal under `torchrun`.
# You will see
#
# 1. the EM example script, run with 2 processes,
# 2. the streaming-training handle under `torchrun` too,
# 3. how one handle serves both launchers,
# 4. how to point the cluster at MPI, SSH or Slurm engines, and what that exposes on the network.

# %% [markdown]
# The next cell imports what we need and defines `torchrun(script)`: it runs a script (and its
# arguments) with 2 processes, exactly as `torchrun --standalone --nproc_per_node 2 script.py` would in a
# terminal (`--standalone` picks a free local port), fails loudly if the script fails, and
# returns what rank 0 printed.

# %%
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import matplotlib.pyplot as plt

import diagrams  # notebooks/diagrams.py: the concept pictures

def torchrun(script, *arguments, nproc=2):
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               f"--nproc_per_node={nproc}", str(script), *map(str, arguments)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        raise RuntimeError(f"torchrun exited with {done.returncode}:\n{done.stderr[-3000:]}")
    return done.stdout


# %% [markdown]
# ## The EM example script
#
# `examples/torchrun_fit.py` fits a 3-component 1-D mixture. Given a `.npy` file of
# observations, each process reads only its own rows of it (`TorchRunEncodedData.from_npy`,
# as the engines did in notebook 02), so no process ever holds the whole data; without a file
# it makes its own. The handle joins the group from the variables torchrun sets (`RANK`,
# `WORLD_SIZE`, `MASTER_ADDR`, `MASTER_PORT`), and `torchrun_out()` lets only rank 0 print.
# The next cell shows the script.

# %%
script = Path("..") / "examples" / "torchrun_fit.py"
print(script.read_text())

# %% [markdown]
# The next cell writes 200,000 points from a 3-component mixture to a `.npy` file in a
# temporary folder, runs the script on it with 2 processes, and prints rank 0's output: the
# all-reduced log-density per step, then the fitted model.

# %%
import numpy as np

from mixle_nb.stats import GaussianDistribution, MixtureDistribution

truth = MixtureDistribution([GaussianDistribution(-3.0, 1.0), GaussianDistribution(0.0, 0.5),
                             GaussianDistribution(4.0, 2.0)], w=[0.3, 0.3, 0.4])
with tempfile.TemporaryDirectory() as folder:
    data_file = Path(folder) / "points.npy"
    np.save(data_file, truth.sampler(seed=0).sample(200_000))
    em_output = torchrun(script, data_file)
print(em_output)

# %% [markdown]
# The picture: the log-density per step, read back from that output.

# %%
steps = [(int(s), float(v)) for s, v in re.findall(r"step\s+(\d+)\s+log-density (\S+)", em_output)]
fig, ax = plt.subplots(figsize=(7, 2.6))
ax.plot(*zip(*steps), "o-", ms=3)
ax.set(title="torchrun, 2 processes: all-reduced log-density per EM step", xlabel="EM step")
plt.show()

# %% [markdown]
# ## The streaming handle under torchrun
#
# Notebook 03's training runs the same way. The next cell writes a short training script to a
# temporary folder (so nothing is left behind), shows it, runs it with 2 processes, and prints
# rank 0's output: the loss every 10 steps (with the count of targets, the tokens whose loss
# was taken), then generated text.

# %%
LM_SCRIPT = '''\
"""Streaming training from a terminal: torchrun --standalone --nproc_per_node 2 train_lm.py"""
import torch

from mixle_nb.neural import CharTokenizer, StreamingTransformerLeafEstimator, build_causal_lm, stdlib_text
from mixle_nb.parallel import StreamingTokenEncodedData, torchrun_out

torch.set_num_threads(1)
text = stdlib_text(60_000)
tok = CharTokenizer.fit(text)
lm = StreamingTransformerLeafEstimator(
    build_causal_lm(tok.vocab_size, d_model=64, n_layer=2, n_head=4, block=32, seed=0), lr=1e-2)
out = torchrun_out()  # rank 0 prints, the other ranks stay quiet


def report(progress):
    print(f"step {progress['step']:3d}  loss {progress['loss']:.3f}  ({progress['targets']:,} targets)",
          file=out, flush=True)


with StreamingTokenEncodedData(tok.encode(text), block=32, batch_size=32, epochs=4, max_steps=100,
                               progress=report, progress_every=10) as th:
    print(f"{th.world} ranks, {len(th):,} tokens and {th.steps_per_epoch} steps an epoch on this rank",
          file=out)
    leaf = th.pysp_seq_estimate(lm, None)
    print(tok.decode(leaf.generate(tok.encode("The "), 100, temperature=0.8, seed=0)), file=out)
'''

with tempfile.TemporaryDirectory() as folder:
    lm_script = Path(folder) / "train_lm.py"
    lm_script.write_text(LM_SCRIPT)
    print(LM_SCRIPT)
    print("---- output of rank 0 ----")
    lm_output = torchrun(lm_script)
print(lm_output)

# %% [markdown]
# The picture: rank 0's loss per report, read back from that output.

# %%
losses = [(int(s), float(v)) for s, v in re.findall(r"step\s+(\d+)\s+loss (\S+)", lm_output)]
fig, ax = plt.subplots(figsize=(7, 2.6))
ax.plot(*zip(*losses), "o-", ms=3)
ax.set(title="torchrun, 2 processes: rank 0's training loss", xlabel="optimizer step",
       ylabel="nats per character")
plt.show()

# %% [markdown]
# ## One handle, two launchers
#
# | | notebook (`%mixle_cluster start N`) | terminal (`torchrun --nproc_per_node N fit.py`) |
# |---|---|---|
# | who starts the processes | `MixleCluster` (ipyparallel engines) | `torchrun` |
# | how the group forms | the cluster calls `init_process_group` on each engine | the handle calls it from `RANK`, `WORLD_SIZE`, `MASTER_*` |
# | how you drive it | cell by cell, panels, `%%mixle` | the script runs to the end |
# | where output goes | rank 0's output streams into the notebook | `torchrun_out()`: rank 0's stdout |
#
# The same table as a picture:

# %%
diagrams.launchers()

# %% [markdown]
# Move to `torchrun` when a fit takes longer than you want to keep a kernel alive, needs
# more machines than a notebook comfortably drives, or must run as a scheduled batch job.
# Explore interactively on a sample first, then run the same handle code at full size.

# %% [markdown]
# ## Engines on other machines: MPI, SSH, Slurm
#
# `MixleCluster(n, launcher=..., **ipyparallel_options)` (or
# `%mixle_cluster start N --launcher mpi`) starts the engines with one of ipyparallel's
# launchers; the options go to `ipyparallel.Cluster`. For example (not run here, since this
# machine has no MPI, SSH hosts or Slurm):
#
# ```python
# from traitlets.config import Config
# from mixle_nb.cluster import MixleCluster
#
# # MPI: mpiexec starts the engines, e.g. on the nodes of your MPI allocation
# cluster = MixleCluster(16, launcher="mpi", controller_ip="*")
#
# # SSH: how many engines to start on each host
# config = Config()
# config.SSHEngineSetLauncher.engines = {"node1": 4, "node2": 4}
# cluster = MixleCluster(8, launcher="ssh", controller_ip="*", config=config)
#
# # Slurm: the engines run as one batch job
# config = Config()
# config.SlurmEngineSetLauncher.account = "my-project"
# config.SlurmEngineSetLauncher.timelimit = "01:00:00"
# cluster = MixleCluster(64, launcher="slurm", controller_ip="*", config=config)
# ```
#
# `controller_ip="*"` lets engines on other hosts reach the controller. Everything else
# (the magics, the panels, the handles) works unchanged.

# %% [markdown]
# ## What the cluster exposes on the network
#
# * **One host (the default):** the controller listens on 127.0.0.1, the ranks meet through
#   a file in a private temporary folder, and gloo is pinned to the loopback interface.
#   Nothing is reachable from other machines.
# * **Several hosts:** the controller must listen on the network (its messages are signed
#   with the cluster's key, not encrypted). The ranks meet through a **TCPStore on engine 0**
#   and then talk over gloo: both are **unauthenticated**, so anyone who can reach those ports
#   can join or disturb the group. `torchrun`'s own rendezvous store is the same.
#   Run multi-host clusters only on a trusted, private network, such as firewalled cluster nodes.
#
# The picture of both cases:

# %%
diagrams.network()

# %% [markdown]
# ## Summary
#
# * The handles need only a process group, so the notebook's code runs unchanged under `torchrun`.
# * Launchers for MPI, SSH and Slurm put engines on other machines; the rest stays the same.
# * On one host nothing leaves loopback; across hosts the rendezvous and gloo links are
#   unauthenticated, so keep them on a trusted network.
#
# Both `torchrun` runs above have finished, and this notebook started no cluster, so no
# process is left running.
#
# **05_mixle_hidden_markov.ipynb** fits a model from the mixle package on the cluster.
