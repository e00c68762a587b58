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
# # 05 · A mixle hidden Markov model on the cluster
#
# The handles of notebooks 02–04 speak the same duck-typed protocol as the
# [mixle](https://pypi.org/project/mixle/) package's own, so a model built with mixle can be
# fitted on our cluster and stepped in our panels, unchanged. Here the model is a **hidden
# Markov model** (HMM), whose observations are whole sequences of different lengths. You will see
#
# 1. ragged data: sequences drawn from a known HMM,
# 2. each rank keeping whole sequences, never cutting one,
# 3. mixle's own functions driving our handle,
# 4. the `EMPanel` stepping EM for the HMM (Baum–Welch) on 4 ranks,
# 5. the result equal to mixle's single-process EM,
# 6. what crossed between ranks.

# %% [markdown]
# The next cell imports numpy, matplotlib, mixle's model classes and our panel, and loads the
# mixle_nb magics. (mixle's classes are imported by name: the magics bind the cluster to the
# variable `mixle`.)

# %%
import matplotlib.pyplot as plt
import numpy as np
import torch

from mixle.inference import seq_estimate
from mixle.stats import (GaussianDistribution, GaussianEstimator, HiddenMarkovEstimator,
                         HiddenMarkovModelDistribution, PoissonDistribution, PoissonEstimator,
                         seq_encode, seq_log_density_sum)
from mixle_nb.stats.values import flatten_value, fold_plan
from mixle_nb.widgets import EMPanel

torch.set_num_threads(1)  # this kernel's maths on one thread: the engines need the cores
# %load_ext mixle_nb

# %% [markdown]
# ## Ragged data from a known model
#
# An HMM has K hidden states. A sequence starts in state k with probability wₖ, moves from
# state i to state j with probability Aᵢⱼ at each step, and emits one observation per step from
# the current state's distribution (here a Gaussian per state). The length of each sequence is
# drawn too (here from a Poisson distribution). We draw 800 sequences from a 3-state model
# whose states mostly stay where they are. The next cell draws them, prints their lengths and
# plots three of them, with the states' means as dashed lines.

# %%
truth = HiddenMarkovModelDistribution(
    [GaussianDistribution(-2.0, 0.5), GaussianDistribution(0.0, 0.3), GaussianDistribution(2.5, 0.8)],
    w=[0.5, 0.3, 0.2],
    transitions=[[0.90, 0.08, 0.02], [0.10, 0.80, 0.10], [0.05, 0.15, 0.80]],
    len_dist=PoissonDistribution(30.0))
sequences = [list(map(float, s)) for s in truth.sampler(seed=0).sample(800)]
lengths = [len(s) for s in sequences]
print(f"{len(sequences)} sequences, {sum(lengths):,} observations, lengths {min(lengths)} to {max(lengths)}")

fig, axes = plt.subplots(1, 2, figsize=(11, 2.6), gridspec_kw={"width_ratios": [1, 2]})
axes[0].hist(lengths, bins=range(min(lengths), max(lengths) + 2), color="#c8d3e0")
axes[0].set(title="sequence lengths", xlabel="length")
for s in sequences[:3]:
    axes[1].plot(s, ".-", ms=3, lw=0.8)
for state in truth.topics:
    axes[1].axhline(state.mu, color="grey", ls="--", lw=0.8)
axes[1].set(title="three sequences: runs near each state's mean", xlabel="position in the sequence")
plt.tight_layout()
plt.show()

# %% [markdown]
# ## Start 4 engines
#
# As in notebook 02: 4 engines, one `torch.distributed` group over loopback, bound to `mixle`.
# The next cell starts them.

# %%
# %mixle_cluster start 4

# %% [markdown]
# ## Each rank keeps whole sequences
#
# The estimator is mixle's: one Gaussian estimator per hidden state and a Poisson estimator for
# the lengths. `%mixle_push` copies the sequences and the estimator to every rank, and each rank
# builds a `TorchRunEncodedData`. A list of sequences is dealt out as a list: rank r keeps
# sequences r, r + world, r + 2·world, … whole, and encodes them with mixle's own encoder. The
# next cell prints what each rank holds.

# %%
est = HiddenMarkovEstimator([GaussianEstimator() for _ in range(3)], len_estimator=PoissonEstimator())
# %mixle_push sequences est

# %% [markdown]
# On every rank (`--all` shows each rank's output):

# %%
# %%mixle --all
from mixle_nb.parallel import TorchRunEncodedData

h = TorchRunEncodedData(sequences, estimator=est)
mine = sequences[h.rank::h.world]
print(f"{h.local_count} of {len(h)} sequences, {sum(map(len, mine)):,} observations")

# %% [markdown]
# ## mixle's functions drive our handle
#
# mixle's `seq_initialize` recognises a handle by its `pysp_*` methods, exactly as it
# recognises its own. Its random start gives each sequence, with probability 0.1, random
# state responsibilities, then takes an M-step; on our handle every rank samples its own
# sequences with a seed the root deals out, and the statistics are folded across ranks, so every
# rank gets the same start. The next cell makes it on every rank and checks that the ranks
# agree, by the start's total log-density (mixle's `seq_log_density_sum`, also through our handle).

# %%
# %%mixle
import numpy as np
from mixle.inference import seq_initialize
from mixle.stats import seq_log_density_sum as mixle_log_density_sum

start = seq_initialize(h, est, np.random.RandomState(0), 0.1)
start_log_density = mixle_log_density_sum(h, start)

# %% [markdown]
# The next cell pulls the start and its log-density from every rank and compares them.

# %%
# starts = %mixle_pull start --all
# start_totals = %mixle_pull start_log_density --all
start = starts[0]
print("the same start on every rank:", all(repr(s) == repr(start) for s in starts))
print("(count, total log-density) per rank:", start_totals)

# %% [markdown]
# ## EM for the HMM, step by step
#
# `EMPanel(mixle, handle="h", estimator="est", model="start")` works as in notebook 02: each
# step runs the forward–backward pass of every rank's sequences, one fold of the statistics,
# and mixle's M-step on every rank. The panel plots the log-density per step and its gain; its
# model picture draws the states' Gaussians weighted by the start probabilities w. The next
# cell creates the panel and runs 15 steps.

# %%
panel = EMPanel(mixle, handle="h", estimator="est", model="start")
panel.run(15)
if panel.error:  # a failed step shows in the panel; raise it here too
    raise panel.error
panel

# %% [markdown]
# A static picture of the panel after those steps, for exported reports:

# %%
panel.snapshot()

# %% [markdown]
# ## The same model as mixle in one process
#
# The next cell runs mixle's own EM here in the notebook, on all the sequences, from the same
# start and for the same number of steps, and compares the log-density per step and the fitted
# parameters with the 4-rank fit.

# %%
enc = seq_encode(sequences, estimator=est)
model, single = start, []
for _ in panel.history:
    single.append(seq_log_density_sum(enc, model)[1])
    model = seq_estimate(enc, est, model)
distributed = [record.log_density for record in panel.history]


def parameters(hmm):
    return np.concatenate([hmm.w, np.ravel(hmm.transitions), [c.mu for c in hmm.topics],
                           [c.sigma2 for c in hmm.topics], [hmm.len_dist.lam]])


relative = np.abs(np.subtract(distributed, single)) / np.abs(single)
gap = np.abs(parameters(panel.model) - parameters(model)).max()
print(f"{len(single)} EM steps: largest relative difference in log-density {relative.max():.1e}, "
      f"largest parameter difference {gap:.1e}")

fig, ax = plt.subplots(figsize=(7, 2.6))
ax.plot(range(1, len(single) + 1), distributed, "o", ms=6, mfc="none", label=f"{mixle.n} ranks (mixle_nb)")
ax.plot(range(1, len(single) + 1), single, "-", label="mixle, one process")
ax.set(title="log-density per EM step", xlabel="EM step")
ax.legend(fontsize=8)
plt.show()

# %% [markdown]
# ## What EM found
#
# The next cell lists the fitted states next to the true ones (ordered by mean; the numbering
# of hidden states is arbitrary), with the transition matrices side by side.

# %%
order, true_order = np.argsort([c.mu for c in panel.model.topics]), np.argsort([c.mu for c in truth.topics])
fitted_a = np.asarray(panel.model.transitions)[np.ix_(order, order)]
true_a = np.asarray(truth.transitions)[np.ix_(true_order, true_order)]
print("state   mean (true, fitted)   variance (true, fitted)   start prob. (true, fitted)")
for i, (t, f) in enumerate(zip(true_order, order)):
    print(f"{i:5d}   {truth.topics[t].mu:6.2f} {panel.model.topics[f].mu:7.3f}"
          f"        {truth.topics[t].sigma2:6.2f} {panel.model.topics[f].sigma2:7.3f}"
          f"           {truth.w[t]:5.2f} {panel.model.w[f]:6.3f}")
print(f"mean length: true {truth.len_dist.lam:.2f}, fitted {panel.model.len_dist.lam:.3f}")
print("transitions (rows: from, columns: to), true | fitted:")
for t_row, f_row in zip(true_a, fitted_a):
    print("   ", np.round(t_row, 2), " | ", np.round(f_row, 3))

# %% [markdown]
# ## What crossed between ranks
#
# The sequences never moved after `%mixle_push`. Per step each rank folded mixle's sufficient
# statistics for its own sequences: a nested value of the initial-state counts, the transition
# counts, each state's Gaussian sums and the length distribution's sums. Our handle flattens
# such a value into one vector and adds the vectors of all ranks in one all-reduce when every
# rank's value has the same layout and `combine` only adds its numbers; otherwise it pickles
# the values to rank 0 and combines them there (the gather fold). The next cell keeps, on every
# rank, how many numbers its last fold sent (`None` would mean the gather fold).

# %%
# %%mixle
sent = h.last_fold_floats

# %% [markdown]
# The next cell pulls those counts, takes apart the statistics of a few sequences (their
# layout is the same for any number of sequences), asks which fold they allow, and compares
# the bytes sent per step with the bytes of a rank's sequences.

# %%
# sent = %mixle_pull sent --all
acc = est.accumulator_factory().make()
few = sequences[:5]
acc.seq_update(seq_encode(few, estimator=est)[0][1], np.ones(len(few)), start)
value = acc.value()


def shapes(v):
    """The nesting of a statistic value, with array shapes."""
    if isinstance(v, (tuple, list)):
        return "(" + ", ".join(shapes(x) for x in v) + ")"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k!r}: {shapes(x)}" for k, x in v.items()) + "}"
    return f"array{np.shape(v)}" if np.ndim(v) else "number"


plan = fold_plan(value, est.accumulator_factory().make)
statistics = flatten_value(value).size
shard_bytes = 8 * sum(lengths) // mixle.n
print("the statistic value's layout:", shapes(value))
print(f"{statistics} numbers; fold: {'all-reduce' if plan is not None else 'gather'}")
if plan is not None:
    kept = ", ".join(f"position {i} (= {v:g})" for i, v in plan.kept)
    print(f"numbers that combine keeps rather than adds: {kept or 'none'}; the model has {start.n_states} states")
print(f"numbers each rank sent in the last step's fold: {sent} "
      f"({sent[0] - statistics} of bookkeeping: status, model check, count, log-density)")
print(f"bytes per rank per step: {sent[0] * 8:,}, against about {shard_bytes:,} bytes of observations per rank")

# %% [markdown]
# ## Stop the cluster
#
# The next cell stops the engines and the controller and waits for their processes to exit.

# %%
# %mixle_cluster stop

# %% [markdown]
# ## Summary
#
# * A mixle model, estimator and encoder run on our handle unchanged; mixle's `seq_initialize`
#   and `seq_log_density_sum` drive it as they drive mixle's own handle.
# * Ragged data are dealt out whole: each rank keeps its own sequences, and counts come from
#   them, not from the encoding.
# * Per step only mixle's statistics (and a few numbers of bookkeeping) cross between ranks,
#   and the fit equals mixle's single-process EM up to rounding.
