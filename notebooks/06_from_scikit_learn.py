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
# # 06 · From scikit-learn: the same `GaussianMixture`, in one process or on the cluster
#
# `mixle_nb.mixture.GaussianMixture` has scikit-learn's constructor, defaults, fitted
# attributes, warnings and errors, and passes scikit-learn's own `check_estimator`; our EM
# core fits it. You will
#
# 1. run an ordinary scikit-learn workflow (a `Pipeline`, `GridSearchCV` over `n_components`
#    scored by held-out log-likelihood, BIC) with only the import changed,
# 2. check that, from the same start, every fitted attribute equals scikit-learn's,
# 3. fit the same estimator on a 4-rank cluster whose ranks read their rows from a file, with
#    its progress printed while it runs, and get the same attributes back,
# 4. pickle the fitted estimator (it keeps nothing of the cluster) and stop the cluster.

# %% [markdown]
# The next cell imports scikit-learn's pieces, our `GaussianMixture` in place of theirs, and
# loads the mixle magics.

# %%
import pickle
import tempfile
import warnings
from pathlib import Path

import numpy as np
import torch
from sklearn.exceptions import ConvergenceWarning
from sklearn.mixture import GaussianMixture as ScikitGaussianMixture
from sklearn.model_selection import GridSearchCV, train_test_split
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

from mixle_nb.mixture import GaussianMixture

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
# ## 3 · The same estimator on the cluster
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
# ## 4 · Nothing of the cluster stays in the estimator
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

# %% [markdown]
# The cluster stops here, and the temporary folder goes with it.

# %%
# %mixle_cluster stop
folder.cleanup()
