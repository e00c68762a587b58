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
# # 06 · From scikit-learn: the same mixtures, in one process or on the cluster
#
# `mixle_nb.mixture.GaussianMixture` and `BayesianGaussianMixture` have scikit-learn's
# constructors, defaults, fitted attributes, warnings and errors, and pass scikit-learn's own
# `check_estimator`; our EM core fits them. You will
#
# 1. run an ordinary scikit-learn workflow (a `Pipeline`, `GridSearchCV` over `n_components`
#    scored by held-out log-likelihood, BIC) with only the import changed,
# 2. check that, from the same start, every fitted attribute equals scikit-learn's,
# 3. let `BayesianGaussianMixture` find how many components the data support,
# 4. weigh rows with `sample_weight` (scikit-learn's mixtures take none) and check that a
#    weight of w is the row repeated w times,
# 5. fit the same estimator on a 4-rank cluster whose ranks read their rows from a file, with
#    its progress printed while it runs, and get the same attributes back,
# 6. fit with `partial_fit`, the ranks reading the file block by block, and watch the
#    log-likelihood of each pass over the file reach the batch fit's,
# 7. pickle the fitted estimator (it keeps nothing of the cluster) and stop the cluster.

# %% [markdown]
# The next cell imports scikit-learn's pieces, our `GaussianMixture` and
# `BayesianGaussianMixture` in place of theirs, matplotlib, and loads the mixle magics.

# %%
import pickle
import tempfile
import warnings
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import torch
from sklearn.exceptions import ConvergenceWarning
from sklearn.mixture import BayesianGaussianMixture as ScikitBayesianGaussianMixture
from sklearn.mixture import GaussianMixture as ScikitGaussianMixture
from sklearn.model_selection import GridSearchCV, train_test_split
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

from mixle_nb.mixture import BayesianGaussianMixture, GaussianMixture

torch.set_num_threads(1)  # this kernel's maths on one thread: the engines need the cores
# %load_ext mixle_nb

# %% [markdown]
# ## 1 · A scikit-learn workflow, unchanged
#
# Data: 20,000 points in 3-D from four Gaussian clusters, in units far from 1 (the scaler in the
# pipeline takes care of that). The next cell draws them and holds a quarter out.

# %%
rng = np.random.default_rng(0)
centres = np.array([[0, 0, 0], [4, 0, 1], [0, 5, -1], [4, 5, 3]], dtype=float)
labels_true = rng.integers(4, size=20_000)
x = (centres[labels_true] + rng.normal(size=(20_000, 3)) * [1.0, 0.7, 1.3]) * 50 + 1_000
x_train, x_test = train_test_split(x, test_size=0.25, random_state=0)
print(f"train {x_train.shape}, test {x_test.shape}")

# %% [markdown]
# `GridSearchCV` tries 1 to 6 components in a `Pipeline`; each candidate is scored by
# `GaussianMixture.score`, the mean log-likelihood of the held-out fold. The next cell runs the
# search and prints the best number of components with each candidate's mean score.

# %%
search = GridSearchCV(make_pipeline(StandardScaler(), GaussianMixture(random_state=0)),
                      {"gaussianmixture__n_components": range(1, 7)}, cv=3)
search.fit(x_train)
for k, mean_score in zip(range(1, 7), search.cv_results_["mean_test_score"]):
    print(f"K = {k}: held-out log-likelihood per point {mean_score:.4f}")
print("best:", search.best_params_)

# %% [markdown]
# The held-out score keeps creeping up a little past the true K; BIC penalises the extra
# parameters. The next cell fits K = 1..6 on the scaled training data and prints the BIC of
# each (lower is better) and the K it picks.

# %%
scaler = StandardScaler().fit(x_train)
z_train, z_test = scaler.transform(x_train), scaler.transform(x_test)
bics = {k: GaussianMixture(k, random_state=0).fit(z_train).bic(z_train) for k in range(1, 7)}
for k, value in bics.items():
    print(f"K = {k}: BIC {value:,.0f}")
best_k = min(bics, key=bics.get)
print("BIC picks K =", best_k)

# %% [markdown]
# ## 2 · The same numbers as scikit-learn, from the same start
#
# Starting points in scikit-learn's own parameters (`weights_init`, `means_init`,
# `precisions_init`), a tolerance of 0 and a fixed number of iterations leave nothing to
# chance: both libraries must run the same EM. The next cell fits both and prints the
# largest relative difference over every fitted array, and the iteration counts.

# %%
ATTRIBUTES = ["weights_", "means_", "covariances_", "precisions_", "precisions_cholesky_", "lower_bounds_"]


def largest_difference(a, b) -> float:
    """The largest |a - b| / |a| over every attribute (exact zeros, as in a Cholesky factor's
    upper triangle, must stay exact)."""
    def relative(u, v):
        u, v = np.asarray(u), np.asarray(v)
        return float(np.max(np.abs(u - v) / np.maximum(np.abs(u), 1e-300)))
    return max(relative(getattr(a, n), getattr(b, n)) for n in ATTRIBUTES)


start = dict(weights_init=np.full(best_k, 1 / best_k), means_init=z_train[:best_k],
             precisions_init=np.stack([np.eye(3)] * best_k))
settings = dict(n_components=best_k, tol=0, max_iter=25, **start)
with warnings.catch_warnings():
    warnings.simplefilter("ignore", ConvergenceWarning)  # tol=0: no fit "converges"
    ours = GaussianMixture(**settings).fit(z_train)
    theirs = ScikitGaussianMixture(**settings).fit(z_train)
print(f"largest relative difference: {largest_difference(theirs, ours):.1e}; "
      f"iterations {ours.n_iter_} and {theirs.n_iter_}; lower bound {ours.lower_bound_:.10f}")
assert largest_difference(theirs, ours) < 1e-8

# %% [markdown]
# ## 3 · How many components? The Bayesian mixture decides
#
# BIC needed six fits. `BayesianGaussianMixture` fits once, with more components than the data
# need (here 6) and a prior on the weights that prefers few: a Dirichlet process (stick
# breaking) whose concentration is small. The components the data do not support end with
# weights near 0. Ours runs the variational update on the EM core; on an array it starts as
# scikit-learn's does (its k-means from `random_state`), so both libraries give the same
# posterior. The next cell fits both on 2,000 of the scaled points and prints the components
# that keep more than 1 % of the weight and the largest relative difference between the two.

# %%
z_small = z_train[:2000]
bayes_settings = dict(n_components=6, weight_concentration_prior=1e-3, max_iter=300, random_state=0)
bayes = BayesianGaussianMixture(**bayes_settings).fit(z_small)
bayes_theirs = ScikitBayesianGaussianMixture(**bayes_settings).fit(z_small)
used = np.flatnonzero(bayes.weights_ > 0.01)
print(f"components with more than 1 % of the weight: {len(used)} (BIC picked {best_k}); "
      f"weights {np.round(bayes.weights_, 3).tolist()}")
bayes_difference = max(
    float(np.max(np.abs(np.asarray(getattr(bayes, n)) - getattr(bayes_theirs, n)) / np.abs(getattr(bayes_theirs, n))))
    for n in ("weights_", "means_", "covariances_", "lower_bound_"))
print(f"largest relative difference from scikit-learn: {bayes_difference:.1e}; "
      f"iterations {bayes.n_iter_} and {bayes_theirs.n_iter_}")
assert len(used) == best_k and bayes_difference < 1e-6

# %% [markdown]
# The weights' posterior is `weight_concentration_`: for the Dirichlet process, a Beta
# distribution per stick break, whose mean fraction of the stick left is what `weights_`
# multiplies out. The other prior, `weight_concentration_prior_type="dirichlet_distribution"`,
# shares the weights among all components at once; here it leaves the spare ones with even
# less. The next cell fits that one too and draws each component's weight under both priors
# (on a log scale), then prints the stick breaks.

# %%
bayes_dirichlet = BayesianGaussianMixture(**bayes_settings,
                                          weight_concentration_prior_type="dirichlet_distribution").fit(z_small)
fig, ax = plt.subplots(figsize=(8, 2.6))
at = np.arange(bayes.n_components)
ax.bar(at - 0.2, bayes.weights_, width=0.4, label="Dirichlet process")
ax.bar(at + 0.2, bayes_dirichlet.weights_, width=0.4, label="Dirichlet distribution")
ax.set(xlabel="component", ylabel="weights_", xticks=at, yscale="log", ylim=(1e-7, 1))
ax.set_title("6 components offered, 4 kept: the spare ones end near 0")
ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1))
plt.show()
alpha, beta = bayes.weight_concentration_
print("stick breaks, mean fraction taken:", np.round(alpha / (alpha + beta), 3).tolist())

# %% [markdown]
# ## 4 · Weighted rows
#
# scikit-learn's mixtures take no `sample_weight` (its issue #15647); ours do, in `fit`,
# `fit_predict`, `partial_fit` and the starts. An integer weight w counts a row w times, so a
# weighted fit must equal the fit of the rows repeated. The next cell draws a weight from 0 to
# 3 per row, fits both ways from section 2's start and prints the largest difference.

# %%
w = np.random.default_rng(1).integers(0, 4, size=len(z_small))
with warnings.catch_warnings():
    warnings.simplefilter("ignore", ConvergenceWarning)  # tol=0 again
    weighted = GaussianMixture(**settings).fit(z_small, sample_weight=w)
    repeated = GaussianMixture(**settings).fit(np.repeat(z_small, w, axis=0))
print(f"{len(z_small):,} weighted rows against {int(w.sum()):,} repeated rows: largest relative "
      f"difference {largest_difference(repeated, weighted):.1e}")
assert largest_difference(repeated, weighted) < 1e-8

# %% [markdown]
# ## 5 · The same estimator on the cluster
#
# `%mixle_cluster start 4` starts 4 engines that form one `torch.distributed` group, bound to
# the variable `mixle`. The next cell starts them.

# %%
# %mixle_cluster start 4

# %% [markdown]
# The data go to a `.npy` file; only its path and the estimator that chooses the encoding
# (`gm.mixture_estimator(3)`, a full-covariance mixture) are pushed. The next cell writes the
# file and pushes those two.

# %%
folder = tempfile.TemporaryDirectory()  # removed at the end of the notebook
path = str(Path(folder.name) / "scaled.npy")
np.save(path, z_train)
est = GaussianMixture(**settings).mixture_estimator(3)
# %mixle_push path est

# %% [markdown]
# Each rank builds a handle on its own rows `r, r + 4, ...` of the file (`%%mixle` runs the
# cell on every rank).

# %%
# %%mixle
from mixle_nb.parallel import TorchRunEncodedData

h = TorchRunEncodedData.from_npy(path, estimator=est)

# %% [markdown]
# `mixle.handle("h")` refers to those handles from the notebook. `fit` on it runs EM where the
# data live; with `verbose=2` rank 0 prints every fifth iteration, and the lines appear here
# while the fit runs. The fitted attributes come back to this estimator. The next cell fits.

# %%
on_ranks = GaussianMixture(**settings, verbose=2, verbose_interval=5)
with warnings.catch_warnings():
    warnings.simplefilter("ignore", ConvergenceWarning)
    on_ranks.fit(mixle.handle("h"))  # noqa: F821 (bound by %mixle_cluster)

# %% [markdown]
# The 4-rank fit must equal the one-process fit, and scoring through the reference must give
# each observation's answer in the original order. The next cell compares both and prints
# the differences.

# %%
labels_here = ours.predict(z_train)
labels_there = on_ranks.predict(mixle.handle("h"))  # noqa: F821
difference = largest_difference(ours, on_ranks)
print(f"4 ranks against one process: largest relative difference {difference:.1e}; "
      f"labels equal: {np.array_equal(labels_here, labels_there)}; "
      f"BIC {on_ranks.bic(mixle.handle('h')):,.1f} against {ours.bic(z_train):,.1f}")  # noqa: F821
assert difference < 1e-8 and np.array_equal(labels_here, labels_there)

# %% [markdown]
# ## 6 · `partial_fit`: the file read block by block, on the ranks
#
# A file too large for the ranks' memory is fitted a chunk at a time. Each `partial_fit` is
# one step of stepwise (online) EM: the running sufficient statistics move towards the
# chunk's, with a step that shrinks as chunks go by. On a cluster reference, one call folds
# every rank's part of the chunk. The next cell defines, on every rank, how chunk `c` is read:
# the file is cut into 4 × 10 successive blocks of rows and rank r reads block 4c + r alone,
# out of a memory map, so a rank never holds more than its block.

# %%
# %%mixle
import numpy as np
import torch.distributed as dist

CHUNKS = 10


def chunk_handle(c):
    """Chunk ``c`` as a handle: this rank's block of rows, read from the file alone."""
    world, rank = dist.get_world_size(), dist.get_rank()
    rows = np.load(path, mmap_mode="r")
    bounds = np.linspace(0, len(rows), world * CHUNKS + 1).astype(int)
    block = np.array(rows[bounds[world * c + rank]:bounds[world * c + rank + 1]])
    return TorchRunEncodedData.from_shards(block, estimator=est, interleaved=False)


# %% [markdown]
# The next cell makes 3 passes over the file: for each chunk it has the ranks read it
# (`execute_async` runs one line on every rank) and folds it with
# `partial_fit(mixle.handle("chunk"))`. After each pass it scores the whole file through the
# handle of section 5 and prints that average log-likelihood beside the batch fit's.

# %%
online = GaussianMixture(best_k, random_state=0)
per_pass = []
for _ in range(3):
    for c in range(10):
        mixle.execute_async(f"chunk = chunk_handle({c})").result()  # noqa: F821
        online.partial_fit(mixle.handle("chunk"))  # noqa: F821
        mixle.execute_async("chunk.close()").result()  # noqa: F821
    per_pass.append(online.score(mixle.handle("h")))  # noqa: F821
batch = ours.score(z_train)
for number, value in enumerate(per_pass, 1):
    print(f"pass {number}: average log-likelihood {value:.5f} (batch fit {batch:.5f}, {value - batch:+.1e})")
assert online.n_iter_ == 30 and abs(per_pass[-1] - batch) < 1e-2

# %% [markdown]
# The next cell draws, on the left, each chunk's own mean log-likelihood (`lower_bounds_`,
# under the model it was folded into: chunks differ by chance) and, on the right, the whole
# file's average log-likelihood after each pass, closing in on the batch fit's.

# %%
fig, (left, right) = plt.subplots(1, 2, figsize=(10, 2.8))
left.plot(np.arange(1, 31) / 10, online.lower_bounds_, color="0.6", label="each chunk")
left.axhline(batch, color="k", linestyle="--", label="batch fit")
left.set(xlabel="passes over the file", ylabel="mean log-likelihood", title="lower_bounds_, chunk by chunk")
right.plot(range(1, 4), per_pass, "o-", label="partial_fit, after each pass")
right.axhline(batch, color="k", linestyle="--", label="batch fit")
right.set(xlabel="passes over the file", xticks=[1, 2, 3], title="the whole file")
left.legend(loc="lower right", fontsize="small")
right.legend(loc="center left", fontsize="small")
plt.tight_layout()
plt.show()

# %% [markdown]
# ## 7 · Nothing of the cluster stays in the estimator
#
# The fitted estimator holds only arrays and numbers: it pickles, and the copy scores the
# held-out data as the original does. The next cell checks that and prints the held-out
# log-likelihood.

# %%
copy = pickle.loads(pickle.dumps(on_ranks))
print(f"held-out log-likelihood per point: {copy.score(z_test):.4f} (pickled copy), "
      f"{ours.score(z_test):.4f} (one process)")

# %% [markdown]
# Last, the next cell closes the handles, stops every cluster process and removes the file.

# %%
# %%mixle
h.close()
del chunk

# %% [markdown]
# The cluster stops here, and the temporary folder goes with it.

# %%
# %mixle_cluster stop
folder.cleanup()
