# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.7
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 07 · Baum–Welch: EM for a hidden Markov model, by hand and on 4 ranks
#
# A hidden Markov model (HMM) explains a sequence by a hidden state that moves from step to
# step as a Markov chain and emits one observation per step from its own distribution. EM for
# an HMM is called Baum–Welch. You will
#
# 1. load real data that ships with matplotlib: monthly prices of ten US stocks and indices,
#    1990–2022, one sequence of returns per ticker,
# 2. take one Baum–Welch step by hand on eight months (forward, backward, the expected
#    statistics, the update) and check it against our EM core,
# 3. step the same kind of model live in the `EMPanel` on 4 ranks, each keeping whole
#    sequences, and let Choose K pick the number of states by BIC,
# 4. check the 4-rank fit against `mixle_nb.hmm.GaussianHMM` (hmmlearn's API) in one process,
# 5. read what the states mean: calm and turbulent months.

# %% [markdown]
# The next cell imports numpy, matplotlib, our HMM family and panel, and loads the mixle magics.

# %%
import csv

import matplotlib.pyplot as plt
import numpy as np
import torch
from matplotlib import cbook

from mixle_nb.hmm import GaussianHMM
from mixle_nb.stats import GaussianDistribution, GaussianEstimator, em_step, seq_encode
from mixle_nb.stats.hmm import HiddenMarkovDistribution, HiddenMarkovEstimator
from mixle_nb.widgets import EMPanel

torch.set_num_threads(1)  # this kernel's maths on one thread: the engines need the cores
# %load_ext mixle_nb

# %% [markdown]
# ## 1 · The data: monthly returns, one sequence per ticker
#
# matplotlib ships `Stocks.csv` (source: Yahoo Finance, as its first line says) for its
# examples: monthly prices of IBM, Apple, Microsoft, Xerox, Amazon, Dell, Google, Adobe and
# the S&P 500 and Nasdaq indices, in rows dated the first of each month (a few rows dated
# otherwise, mostly empty, are left out). A ticker's sequence is its monthly log-returns from
# its first listed month. Each is divided by its own standard deviation, so that a state means
# "calmer or wilder than this ticker's usual", not "a volatile stock". The next cell reads the
# file, builds the ten sequences and plots two of them.

# %%
with open(cbook.get_sample_data("Stocks.csv", asfileobj=False)) as file:
    rows = [row for row in csv.reader(file) if row and not row[0].startswith("#")]
tickers, body = rows[0][1:], [row for row in rows[1:] if row[0].endswith("-01")]  # month starts
months = np.array([row[0] for row in body], dtype="datetime64[M]")
prices = np.array([[float(v) if v else np.nan for v in row[1:]] for row in body])
sequences, first_month = [], []
for j in range(len(tickers)):
    listed = np.isfinite(prices[:, j])
    returns = np.diff(np.log(prices[listed, j]))
    sequences.append(returns / returns.std())
    first_month.append(months[listed][1])
lengths = [len(s) for s in sequences]
print(f"{len(sequences)} sequences, {sum(lengths):,} months in all, lengths {min(lengths)} to {max(lengths)}")

fig, ax = plt.subplots(figsize=(11, 2.6))
for j in (tickers.index("^GSPC"), tickers.index("AMZN")):
    ax.plot(first_month[j] + np.arange(lengths[j]), sequences[j], lw=0.8, label=tickers[j])
ax.set(title="monthly log-return / its standard deviation", xlabel="month")
ax.legend(fontsize=8)
plt.show()

# %% [markdown]
# ## 2 · One Baum–Welch step by hand
#
# Take a 2-state model: start probabilities $w$, transitions $A_{ij}$ (from state $i$ to $j$)
# and a Gaussian $b_k(x) = \mathcal N(x; \mu_k, \sigma_k^2)$ per state, and eight months of the
# S&P 500. The **forward** pass sums over the paths into each state,
# $\alpha_1(k) = w_k b_k(x_1)$, $\alpha_t(j) = \sum_i \alpha_{t-1}(i) A_{ij} b_j(x_t)$, and
# $L = \sum_k \alpha_T(k)$ is the likelihood. The **backward** pass sums over the paths out,
# $\beta_T = 1$, $\beta_t(i) = \sum_j A_{ij} b_j(x_{t+1}) \beta_{t+1}(j)$. Then the posteriors:
# of a state, $\gamma_t(k) = \alpha_t(k)\beta_t(k)/L$, and of a transition,
# $\xi_t(i,j) = \alpha_t(i) A_{ij} b_j(x_{t+1}) \beta_{t+1}(j) / L$. The next cell computes
# them in plain numpy (eight steps need no rescaling).

# %%
x = sequences[tickers.index("^GSPC")][:8]
w, A = np.array([0.5, 0.5]), np.array([[0.9, 0.1], [0.2, 0.8]])
mu, var = np.array([0.3, -0.5]), np.array([0.5, 3.0])
b = np.exp(-0.5 * (x[:, None] - mu) ** 2 / var) / np.sqrt(2 * np.pi * var)  # b[t, k]

alpha, beta = np.zeros((8, 2)), np.ones((8, 2))
alpha[0] = w * b[0]
for t in range(1, 8):
    alpha[t] = alpha[t - 1] @ A * b[t]
for t in range(6, -1, -1):
    beta[t] = A @ (b[t + 1] * beta[t + 1])
L = alpha[-1].sum()
gamma = alpha * beta / L
xi = alpha[:-1, :, None] * A[None] * (b[1:] * beta[1:])[:, None, :] / L
print(f"log-likelihood {np.log(L):.6f}; each gamma_t sums to 1: {np.allclose(gamma.sum(axis=1), 1)}")
print("P(state 1 | all eight months):", np.round(gamma[:, 1], 3))

# %% [markdown]
# The **M-step** is the update a mixture would make, with the posteriors as weights, plus the
# chain's: $w' = \gamma_1$, $A'_{ij} = \sum_t \xi_t(i,j) / \sum_{t<T} \gamma_t(i)$,
# $\mu'_k = \sum_t \gamma_t(k) x_t / \sum_t \gamma_t(k)$ and $\sigma'^2_k$ the weighted variance.
# The next cell computes it and compares it with one step of our EM core (batched over
# sequences in torch, in log space) from the same model, its Gaussians estimated by plain
# maximum likelihood (`reg_covar=0`, no floor added to the variances).

# %%
new_w = gamma[0]
new_A = xi.sum(axis=0) / gamma[:-1].sum(axis=0)[:, None]
new_mu = gamma.T @ x / gamma.sum(axis=0)
new_var = (gamma * (x[:, None] - new_mu) ** 2).sum(axis=0) / gamma.sum(axis=0)

start_model = HiddenMarkovDistribution([GaussianDistribution(m, v) for m, v in zip(mu, var)], w, A)
estimator = HiddenMarkovEstimator([GaussianEstimator(reg_covar=0.0), GaussianEstimator(reg_covar=0.0)])
step = em_step(seq_encode([x], model=start_model), estimator, start_model)
ours = step.model
by_hand = np.concatenate([new_w, new_A.ravel(), new_mu, new_var])
core = np.concatenate([ours.startprob, ours.transmat.ravel(), [e.mu for e in ours.emissions],
                       [e.sigma2 for e in ours.emissions]])
print(f"largest difference, by hand against the EM core: {np.abs(by_hand - core).max():.1e}; "
      f"log-likelihood {step.log_density:.6f}")
assert np.abs(by_hand - core).max() < 1e-10 and abs(step.log_density - np.log(L)) < 1e-10

# %% [markdown]
# ## 3 · The same model on 4 ranks, live in the panel
#
# `%mixle_cluster start 4` starts 4 engines in one `torch.distributed` group, bound to `mixle`.
# The next cell starts them.

# %%
# %mixle_cluster start 4

# %% [markdown]
# The next cell pushes the sequences, the estimator and a start to every rank; on each rank a
# `TorchRunEncodedData` deals the list of sequences out as whole sequences (rank r keeps
# sequences r, r + 4, …) and prints what it keeps.

# %%
start = HiddenMarkovDistribution([GaussianDistribution(0.5, 0.5), GaussianDistribution(-0.5, 2.0)],
                                 [0.5, 0.5], [[0.9, 0.1], [0.1, 0.9]])
# %mixle_push sequences estimator start

# %% [markdown]
# On every rank (`--all` shows each rank's output):

# %%
# %%mixle --all
from mixle_nb.parallel import TorchRunEncodedData

h = TorchRunEncodedData(sequences, estimator=estimator)
print(f"rank {h.rank}: {h.local_count} of {len(h)} sequences")

# %% [markdown]
# The panel steps Baum–Welch on the ranks: each step runs the forward–backward pass of every
# rank's sequences, adds the statistics across ranks in one all-reduce, and takes the M-step
# on every rank. Below the log-density and its gain, the picture shows the transition matrix
# as a heat map, each state's Gaussian (weighted by its share of the months) over a histogram
# of a sequence, and that sequence coloured by its most likely (Viterbi) states. The next
# cell runs 25 steps.

# %%
panel = EMPanel(mixle, handle="h", estimator="estimator", model="start", model_selection=True)
panel.run(25)
if panel.error:  # a failed step shows in the panel; raise it here too
    raise panel.error
panel

# %% [markdown]
# A static picture of the panel, for exported reports:

# %%
panel.snapshot()

# %% [markdown]
# **Choose K** (the button, or `choose_k`) fits 1, 2 and 3 states on the ranks, each state a
# copy of the first state's family started from random posteriors, and scores each fit by BIC,
# $-2\log L + p \log N$, with $N$ the months (hmmlearn's count: samples, not sequences). The
# next cell runs it and prints the scores.

# %%
panel.choose_k(3, seed=0)
for k, bic in zip(panel.k_choice["k"], panel.k_choice["bic"]):
    print(f"K = {k}: BIC {bic:,.1f}")
print("BIC chooses K =", panel.k_choice["best_k"])

# %% [markdown]
# Each fit starts its states' Gaussians where k-means‖ finds the months' centres (the panel's
# Init choice, run on the ranks). The scores printed above say whether a further state buys
# more likelihood than its parameters cost; section 5 lists the states of the fit BIC chose
# next to the 2-state fit the panel stepped, which the rest of the notebook reads.
#
# ## 4 · The same fit in one process, through hmmlearn's API
#
# `mixle_nb.hmm.GaussianHMM` has hmmlearn's signature and attributes. The next cell fits it
# here on the concatenated months with their `lengths`, from the panel's start, for the same
# number of steps, and compares its log-likelihood per step with the panel's. (hmmlearn puts
# a prior on the variances by default; `covars_prior=0` makes its M-step maximum likelihood,
# as the estimator's.)

# %%
one = GaussianHMM(2, covariance_type="diag", covars_prior=0.0, init_params="", n_iter=len(panel.history),
                  tol=-np.inf)
one.startprob_, one.transmat_ = start.startprob, start.transmat
one.means_ = np.array([[e.mu] for e in start.emissions])
one.covars_ = np.array([[e.sigma2] for e in start.emissions])
one.fit(np.concatenate(sequences)[:, None], lengths)
on_ranks = [r.log_density for r in panel.history]
relative = np.abs(np.subtract(on_ranks, one.monitor_.history)) / np.abs(on_ranks)
print(f"{len(on_ranks)} steps: largest relative difference in log-likelihood {relative.max():.1e}")
assert relative.max() < 1e-10

# %% [markdown]
# ## 5 · What the states mean
#
# The next cell lists the fitted states (returns in units of each ticker's standard
# deviation): mean, spread, how long a stay lasts on average ($1/(1 - A_{kk})$ months) and the
# share of months in the state in the long run.

# %%
model = panel.model
stay = 1 / (1 - np.diag(model.transmat))
share = one.get_stationary_distribution()
calm = int(np.argmin([e.sigma2 for e in model.emissions]))
for k, e in enumerate(model.emissions):
    name = "calm" if k == calm else "turbulent"
    print(f"state {k} ({name:9s}): mean {e.mu:+.2f}, sd {np.sqrt(e.sigma2):.2f}, "
          f"stays {stay[k]:5.1f} months on average, {share[k]:.0%} of months")

# %% [markdown]
# The fit BIC chose, its states ordered by spread, in the same terms:

# %%
chosen = panel.k_choice["models"][panel.k_choice["k"].index(panel.k_choice["best_k"])]
chosen_stay = 1 / (1 - np.diag(chosen.transmat))
for k in np.argsort([e.sigma2 for e in chosen.emissions]):
    e = chosen.emissions[k]
    print(f"state {k}: mean {e.mu:+.2f}, sd {np.sqrt(e.sigma2):.2f}, stays {chosen_stay[k]:5.1f} months on average")

# %% [markdown]
# Decoding every sequence with the 2-state fit (Viterbi) dates the turbulent spells. The next cell plots, month by
# month, the share of the listed tickers in the turbulent state, and prints the years in which
# it passed one half.

# %%
paths = model.seq_viterbi(seq_encode(sequences, model=model))[1]
turbulent, listed = np.zeros(len(months)), np.zeros(len(months))
at = 0
for j, n in enumerate(lengths):
    index = np.searchsorted(months, first_month[j]) + np.arange(n)
    turbulent[index] += paths[at:at + n] != calm
    listed[index] += 1
    at += n
fraction = turbulent / np.maximum(listed, 1)
fig, ax = plt.subplots(figsize=(11, 2.4))
ax.fill_between(months.astype("datetime64[D]"), fraction, step="mid", color="#c0392b", alpha=0.6)
ax.set(title="share of tickers in the turbulent state", ylim=(0, 1))
plt.show()
print("years with a month where most tickers were turbulent:",
      sorted({int(str(m)[:4]) for m in months[fraction > 0.5]}))

# %% [markdown]
# The turbulent state is the months in which prices swing about twice as far as in calm ones,
# and it comes in spells of years, not months: the recession of the early 1990s, the dot-com
# boom and bust (1998–2002), the financial crisis (2007–2009) and the pandemic crash of 2020.
# The calm state has the higher mean return: quiet markets were, on average, rising ones.
# The 3-state fit splits the turbulent months once more: its widest state is short-lived (a few
# months a stay) and the only one with a negative mean, the crashes apart from the merely
# restless months.
#
# Last, the next cell closes the handle on the ranks.

# %%
# %%mixle
h.close()

# %% [markdown]
# The cluster stops here.

# %%
# %mixle_cluster stop
