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
# # 02 · Distributed EM on a cluster of engines
#
# The same EM as in notebook 01, on 4 worker processes. Each worker (a **rank**) keeps a
# quarter of the data; per EM step the ranks exchange only the sufficient statistics. You
# will
#
# 1. start 4 engines that form one `torch.distributed` group,
# 2. shard the data across them with `TorchRunEncodedData`,
# 3. step EM interactively and watch the all-reduced log-density,
# 4. check that the 4-rank model equals the single-process model,
# 5. see what travels between ranks per step and what a step costs,
# 6. fit a 2-D mixture the same way, and stop everything.

# %% [markdown]
# The next cell imports what the notebook uses and loads the mixle magics
# (`%mixle_cluster`, `%mixle_push`, `%mixle_pull`, `%%mixle`).

# %%
import os

import matplotlib.pyplot as plt
import numpy as np
import torch

from mixle_nb.stats import (GaussianDistribution, MixtureDistribution,
                            MultivariateGaussianDistribution, em_step, seq_encode)
from mixle_nb.stats.values import flatten_value
from mixle_nb.widgets import EMPanel
import diagrams  # notebooks/diagrams.py: the concept pictures

torch.set_num_threads(1)  # this kernel's maths on one thread: the engines need the cores
# %load_ext mixle_nb

# %% [markdown]
# ## Start the cluster
#
# `%mixle_cluster start 4` launches an ipyparallel controller and 4 engines, then joins the
# engines into one `torch.distributed` group: engine r is rank r. On one machine the group
# talks over loopback only. The cluster object is bound to the variable `mixle`.
#
# The next cell starts it and shows one row per rank. (Engines that outnumber the machine's
# cores take turns on them: fine for learning, not for speed.)

# %%
# %mixle_cluster start 4

# %% [markdown]
# The picture of what just started: the kernel talks to the engines through the controller,
# and the engines talk to each other directly.

# %%
diagrams.cluster(world=mixle.n)

# %% [markdown]
# ## The data
#
# 200,000 points from a 4-component mixture, drawn here in the notebook, and a starting
# model with four wide bumps. The next cell draws both.

# %%
truth = MixtureDistribution([GaussianDistribution(-5.0, 1.0), GaussianDistribution(-1.5, 0.6),
                             GaussianDistribution(1.5, 0.8), GaussianDistribution(5.0, 1.5)],
                            w=[0.2, 0.3, 0.3, 0.2])
x = truth.sampler(seed=1).sample(200_000)
start = MixtureDistribution([GaussianDistribution(mu, 2.0) for mu in (-3.0, -1.0, 1.0, 3.0)],
                            w=[0.25] * 4)
est = start.estimator()

grid = np.linspace(x.min(), x.max(), 500)
fig, ax = plt.subplots(figsize=(8, 2.6))
ax.hist(x, bins=150, density=True, color="#c8d3e0")
ax.plot(grid, np.exp(start.seq_log_density(seq_encode(grid, model=start))), color="#c0392b",
        label="start model")
ax.set(title=f"{len(x):,} points and the starting model", xlabel="x")
ax.legend(fontsize=8)
plt.show()

# %% [markdown]
# ## Each rank reads its own part from disk
#
# In a real job the data are already in files, often larger than the notebook's memory, so
# they should never pass through the notebook. Here we stand in for that by saving the points
# to a `.npy` file in a temporary folder. Then `%mixle_push` copies only small things to every
# rank under the same names: the file's path, the estimator and the start model. The next cell
# does both and compares what was pushed with the size of the data.

# %%
import pickle
import tempfile
from pathlib import Path

folder = tempfile.TemporaryDirectory()  # removed at the end of the notebook
path = str(Path(folder.name) / "points.npy")
np.save(path, x)
print(f"{path}: {Path(path).stat().st_size:,} bytes on disk; pushed to each rank: "
      f"{len(pickle.dumps((path, est, start))):,} bytes")
# %mixle_push path est start

# %% [markdown]
# `%%mixle` runs a cell on every rank (`--all` shows every rank's output). Here each rank
# builds a `TorchRunEncodedData` handle with `from_npy`: rank r of `world` reads only its rows
# r, r + world, r + 2·world, … of the file, encodes them once and keeps them resident for every
# later step. The cell prints what each rank holds, and keeps its raw rows (read again from the
# file) for the picture below.

# %%
# %%mixle --all
import numpy as np
from mixle_nb.parallel import TorchRunEncodedData

h = TorchRunEncodedData.from_npy(path, estimator=est)
my_points = np.load(path, mmap_mode="r")[h.rank::h.world].copy()
print(f"{h.local_count:,} of {len(h):,} points resident")

# %% [markdown]
# `%mixle_pull name --all` brings a variable back from every rank. The next cell pulls each
# rank's points and overlays their histograms: every shard looks like the whole data, at
# 1/world of the size.

# %%
# shards = %mixle_pull my_points --all
fig, ax = plt.subplots(figsize=(8, 2.6))
for rank, points in enumerate(shards):
    ax.hist(points, bins=150, histtype="step", label=f"rank {rank}: {len(points):,} points")
ax.set(title="each rank's shard of the data", xlabel="x")
ax.legend(fontsize=8)
plt.show()

# %% [markdown]
# ## Step EM interactively
#
# `EMPanel(mixle, handle="h", estimator="est", model="start")` drives EM on the ranks; the
# strings are the names these objects have there. Each **Step** sends one call to every rank:
# E-step on the rank's shard → one all-reduce of the statistics → the same M-step everywhere.
# Left: the all-reduced log-density per step; middle: the model over a sample of rank 0's
# points; right: each rank's E-step time. A second row of controls starts from the data
# instead (**Init**) and chooses the number of components (**Choose K**); we use it below.
#
# The next cell creates the panel.

# %%
panel = EMPanel(mixle, handle="h", estimator="est", model="start", model_selection=True)
panel

# %% [markdown]
# One step, then 24 more (the **Step** and **Run N** buttons); the panel above redraws as they go.

# %%
panel.step()
panel.run(24)
if panel.error:  # a failed step shows in the panel; raise it here too
    raise panel.error

# %% [markdown]
# A static picture of the panel after 25 steps, for exported reports:

# %%
panel.snapshot()

# %% [markdown]
# The all-reduced log-density per EM step as a table. Each value belongs to the model the
# step started from; it never decreases.

# %% tags=["summary"]
print(f"1-D mixture on {mixle.n} ranks: all-reduced log-density per EM step")
print(" step     log-density")
for record in panel.history:
    print(f"{record.step:5d}  {record.log_density:14.4f}")


# %% [markdown]
# ## The same model as one process
#
# Summing in a different order changes only the last bits of the result, so the 4-rank fit
# must equal a single-process fit from the same start after the same number of steps, up to
# rounding. The next cell runs those 25 steps here in the notebook with `em_step` on all the
# data, and plots both log-density curves and their difference.

# %%
def parameters(model):
    return np.concatenate([model.w] + [np.ravel(c.mu) for c in model.components]
                          + [np.ravel(c.sigma2) for c in model.components])

enc = seq_encode(x, model=start)
model, single = start, []
for _ in range(len(panel.history)):
    result = em_step(enc, est, model)
    single.append(result.log_density)
    model = result.model
distributed = [record.log_density for record in panel.history]

fig, axes = plt.subplots(1, 2, figsize=(10, 2.6))
steps = range(1, len(single) + 1)
axes[0].plot(steps, distributed, "o", ms=6, mfc="none", label=f"{mixle.n} ranks")
axes[0].plot(steps, single, "-", label="1 process")
axes[0].set(title="log-density per EM step", xlabel="EM step")
axes[0].legend(fontsize=8)
relative = np.abs(np.subtract(distributed, single)) / np.abs(single)
axes[1].semilogy(steps, np.maximum(relative, 1e-17), "o-", ms=3)  # an exact match sits at the bottom
axes[1].set(title="relative difference (rounding level)", xlabel="EM step", ylim=(1e-17, 1e-8))
plt.tight_layout()
plt.show()

# %% [markdown]
# The agreement in one line: the largest parameter difference after the same steps.

# %% tags=["summary"]
gap = np.abs(parameters(panel.model) - parameters(model)).max()
print(f"{mixle.n} ranks vs 1 process, same start, {len(single)} EM steps: "
      f"max |parameter difference| = {gap:.1e}")

# %% [markdown]
# ## What travels between ranks per step
#
# The data never moves after sharding. Per step each rank contributes one vector of float64
# numbers to one all-reduce, whatever the number of points:
#
# * the statistics: K counts, then [Σr, Σr·c, Σr·(x−c), Σr·(x−c)²] per component, taken about
#   each component's previous mean c (the user guide's "Numerics": sums that keep their digits far
#   from the origin), so K·(1+3D) + K numbers;
# * a few numbers of bookkeeping: the count of points and the log-density, a status word (so
#   that an error on one rank stops every rank at once instead of leaving them waiting), and
#   a check that every rank stepped the same model.
#
# Each rank's handle remembers how many numbers its last step's fold sent. The next cell
# keeps that number in a variable, `sent`, on every rank.

# %%
# %%mixle
sent = h.last_fold_floats

# %% [markdown]
# The next cell pulls them back, counts the statistics from the flattened value of an
# accumulator, checks that count against the formula above, compares the bytes sent with the
# bytes of one rank's shard, and draws the step.

# %%
# sent = %mixle_pull sent --all
acc = est.accumulator_factory().make()
acc.seq_update(seq_encode(x[:10], model=start), None, start)
statistics = flatten_value(acc.value()).size
K, D = len(start.components), 1
assert statistics == K * (1 + 3 * D) + K and len(set(sent)) == 1
numbers, bookkeeping = sent[0], sent[0] - statistics
shard = len(x) // mixle.n
sizes = {"one rank's shard\n(raw float64)": shard * 8, "sent per rank\nper EM step": numbers * 8}
print(f"K = {K}, D = {D}: {statistics} statistics + {bookkeeping} of bookkeeping = {numbers} float64 numbers"
      f" = {numbers * 8} bytes per rank per step, against {shard * 8:,} bytes of data resident on each rank")
diagrams.em_step(world=mixle.n, shard=shard, numbers=numbers)

fig, ax = plt.subplots(figsize=(5, 2.6))
ax.bar(list(sizes), list(sizes.values()), color=["#7f8c8d", "#e67e22"])
for i, size in enumerate(sizes.values()):
    ax.text(i, size * 1.3, f"{size:,} B", ha="center", fontsize=9)
ax.set(title="bytes: data that stays vs statistics that travel", ylabel="bytes",
       yscale="log", ylim=(1, 1e7))
plt.show()

# %% [markdown]
# ## What a step costs
#
# Each rank records how long its last step spent in the **E-step** (its own work on its
# shard), the **fold** (the all-reduce, which also waits for the slowest rank) and the
# **M-step** (tiny). The next cell keeps each rank's timings of the last step in a variable,
# `timing`, on that rank.

# %%
# %%mixle
timing = h.last_timings

# %% [markdown]
# The next cell pulls them back (`%mixle_pull timing --all`) and draws milliseconds per rank,
# stacked, and compares the ranks with this machine's cores. With more ranks than cores the fold
# is mostly waiting for a rank that was not scheduled; on a machine with a core per rank it is small.

# %%
# timings = %mixle_pull timing --all
print(f"{len(timings)} ranks on {os.cpu_count()} cores")
parts = {"E-step": [t.e_step_s for t in timings], "fold (all-reduce)": [t.fold_s for t in timings],
         "M-step": [t.m_step_s for t in timings]}
fig, ax = plt.subplots(figsize=(6, 2.8))
bottom = np.zeros(len(timings))
for label, seconds in parts.items():
    ax.bar(range(len(timings)), np.multiply(seconds, 1000), bottom=bottom, label=label)
    bottom += np.multiply(seconds, 1000)
ax.set(title="last EM step, per rank", xlabel="rank", ylabel="milliseconds", xticks=range(len(timings)))
ax.legend(fontsize=8)
plt.show()
for rank, t in enumerate(timings):
    print(f"rank {rank}: {t.shard:,} points  E-step {t.e_step_s * 1e3:6.1f} ms  "
          f"fold {t.fold_s * 1e3:6.1f} ms  M-step {t.m_step_s * 1e3:5.2f} ms")

# %% [markdown]
# ## How many components? Choosing K by BIC on the cluster
#
# So far we told EM how many components to fit. With your own data you do not know it. The
# Bayesian information criterion scores a fit by BIC = −2 log L + p log N, where log L is the
# log-density of the data, p the number of free parameters and N the number of points: more
# components always raise log L, and the p log N term charges for each parameter they add.
# The K with the lowest BIC wins.
#
# The panel's **Choose K** button (its twin is `panel.choose_k(k_max)`) runs
# `mixle_nb.inference.choose_k` on every rank at once, on the resident shards: for each K it
# fits a mixture with `fit` from a k-means++ start (on a handle it runs as k-means‖, where the
# shards live) and scores it with one log-density all-reduce; every rank ends with the same
# fits. The next cell fits K = 1 … 6; the panel above then shows BIC and AIC against K.

# %%
panel.choose_k(6)

# %% [markdown]
# The next cell prints the scores (kept in `panel.k_choice`) with the K that BIC picks
# (compare it with the number of components the data were drawn from), and plots how far each
# K's BIC and AIC lie above their lowest value (a log scale: near the best K the differences
# are small), for exported reports.

# %% tags=["summary"]
scores = panel.k_choice
best_k = scores["best_k"]
print(f"choose K by BIC on {mixle.n} ranks: the data were drawn from {len(truth.components)} components")
print("  K           BIC           AIC")
for k, b, a in zip(scores["k"], scores["bic"], scores["aic"]):
    print(f"{k:3d}  {b:12.1f}  {a:12.1f}{'   <- lowest BIC' if k == best_k else ''}")

fig, ax = plt.subplots(figsize=(6, 2.6))
for name, style in (("bic", "o-"), ("aic", "s--")):
    ax.plot(scores["k"], np.subtract(scores[name], min(scores[name])), style, ms=5, label=name.upper())
ax.axvline(best_k, color="grey", lw=0.8)
ax.set(title=f"information criteria against K (BIC picks K = {best_k})", xlabel="K",
       ylabel="above its lowest value", yscale="symlog", ylim=(0, None))
ax.legend(fontsize=8)
plt.show()

# %% [markdown]
# ## A second example: a 2-D mixture
#
# Nothing above was specific to one dimension. Here are 20,000 points in 2-D from three
# Gaussians with full covariance matrices, and a start of three round bumps near the middle.
# Data this small can also be pushed from the notebook: `%mixle_push` sends the whole array to
# every rank, and each keeps its own rows. The next cell pushes them to the ranks.

# %%
truth2 = MixtureDistribution([
    MultivariateGaussianDistribution([-2.5, 0.0], [[1.0, 0.6], [0.6, 1.0]]),
    MultivariateGaussianDistribution([2.0, 2.0], [[0.6, -0.3], [-0.3, 0.8]]),
    MultivariateGaussianDistribution([1.5, -2.5], [[1.5, 0.0], [0.0, 0.3]])], w=[0.4, 0.3, 0.3])
x2 = truth2.sampler(seed=2).sample(20_000)
start2 = MixtureDistribution([MultivariateGaussianDistribution(mu, 3 * np.eye(2))
                              for mu in ([-1.0, 0.0], [0.0, 1.0], [1.0, 0.0])], w=[1 / 3] * 3)
est2 = start2.estimator()
# %mixle_push x2 est2 start2

# %% [markdown]
# Each rank builds a second handle, `h2`, on its quarter of the 2-D points:

# %%
# %%mixle
h2 = TorchRunEncodedData(x2, estimator=est2)
print(f"rank 0 holds {h2.local_count:,} of {len(h2):,} points")

# %% [markdown]
# A second panel on `h2`, run for 25 steps. The middle plot now shows each component as an
# ellipse two standard deviations wide over the points (thicker = larger weight).

# %%
panel2 = EMPanel(mixle, handle="h2", estimator="est2", model="start2")
panel2.run(25)
if panel2.error:
    raise panel2.error
panel2

# %% [markdown]
# A static picture of the 2-D fit after 25 steps:

# %%
panel2.snapshot()

# %% [markdown]
# With full covariances each component has 1 + 2D + D² sums (the count, the reference, the
# first and the second centred moments), so each rank now sends K·(1 + 2D + D²) + K statistics
# per step, and the same bookkeeping as before. The next cell counts them.

# %%
acc2 = est2.accumulator_factory().make()
acc2.seq_update(seq_encode(x2[:10], model=start2), None, start2)
statistics2 = flatten_value(acc2.value()).size
K2, D2 = len(start2.components), x2.shape[1]
assert statistics2 == K2 * (1 + 2 * D2 + D2 ** 2) + K2
print(f"2-D, K={len(start2.components)}, full covariance: {statistics2} statistics + {bookkeeping} of "
      f"bookkeeping = {statistics2 + bookkeeping} float64 numbers per rank per step")

# %% [markdown]
# ## Stop the cluster
#
# `%mixle_cluster status` shows each rank's memory and its last call's time; then
# `%mixle_cluster stop` leaves the group, stops the engines and the controller, and waits
# until their processes have exited. The next cell does both, and removes the data file.

# %%
# %mixle_cluster status
# %mixle_cluster stop
folder.cleanup()

# %% [markdown]
# ## Summary
#
# * Each rank reads its own rows from the data file and keeps them; per step only the
#   K·(1+3D) + K statistics and a few numbers of bookkeeping travel from each rank, in one all-reduce.
# * Every rank runs the same M-step on the same totals, so every rank holds the same model,
#   and it equals the one-process model up to rounding.
# * The fold's cost is mostly waiting for the slowest rank.
# * Model choice runs where the data are too: **Choose K** fits each K on the ranks and BIC picks one.
#
# Next, **03_streaming_transformer.ipynb** trains a neural network across the same kind of
# cluster, where the gradient, not a statistic, is what travels.
