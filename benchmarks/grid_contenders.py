"""The peer grid's contenders (``benchmarks/peer_grid.py``): its data, the shared start, and for
each library a pair of calls, ``steps(m)`` (a fit of exactly ``m`` EM iterations from the shared
start) and ``whole(seed)`` (the library's own ``fit`` with its defaults and that seed, returning
its iterations).

``mixle_nb.mixture.GaussianMixture``, scikit-learn's ``GaussianMixture``, pomegranate 1.1.2's
``GeneralMixtureModel`` of ``Normal`` (CPU, float64; no ``tied`` covariance) and torchgmm 0.1.4's
``GaussianMixture`` (float32, a Lightning trainer). The peers are the ``bench`` extra, never the
package's dependencies.
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
import torch

Steps = Callable[[int], Any]
Whole = Callable[[int], Any]
BLOCK_ROWS = 1_000_000  # make_data draws this many rows at a time: its temporaries stay a block's


def make_data(n: int, d: int, k: int, seed: int = 0) -> np.ndarray:
    """``n`` points of ``d`` dimensions from ``k`` separated unit-ish Gaussians, drawn a block of
    rows at a time (N = 1e7, D = 64 is 5 GB: whole-array temporaries would triple it)."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(0.0, 4.0, size=(k, d))
    scales = rng.uniform(0.5, 1.5, size=(k, d))
    x = np.empty((n, d))
    for first in range(0, n, BLOCK_ROWS):
        rows = min(BLOCK_ROWS, n - first)
        labels = rng.integers(0, k, size=rows)
        x[first : first + rows] = centres[labels] + rng.normal(0.0, 1.0, size=(rows, d)) * scales[labels]
    return x


def start(x: np.ndarray, k: int, seed: int = 1) -> tuple[np.ndarray, np.ndarray, float]:
    """The shared start: ``k`` data points as means, equal weights, the data's variance."""
    rng = np.random.default_rng(seed)
    means = x[rng.choice(len(x), size=k, replace=False)]
    return np.full(k, 1.0 / k), means, float(x[:BLOCK_ROWS].var(axis=0).mean())  # a block: no 5 GB temporary


def precisions_init(cov: str, k: int, d: int, variance: float) -> np.ndarray:
    """scikit-learn's ``precisions_init`` for covariance ``variance·I``."""
    shapes = {"full": (k, d, d), "tied": (d, d), "diag": (k, d), "spherical": (k,)}
    if cov in ("full", "tied"):
        return np.broadcast_to(np.eye(d) / variance, shapes[cov]).copy()
    return np.full(shapes[cov], 1.0 / variance)


def mixle_fitter(x: np.ndarray, k: int, cov: str) -> tuple[Steps, Whole]:
    """``mixle_nb.mixture.GaussianMixture``'s calls."""
    from mixle_nb.mixture import GaussianMixture

    weights, means, variance = start(x, k)
    given = dict(weights_init=weights, means_init=means, precisions_init=precisions_init(cov, k, x.shape[1], variance))

    def steps(m: int) -> None:
        GaussianMixture(k, covariance_type=cov, tol=0, max_iter=m, **given).fit(x)

    def whole(seed: int) -> int:
        return GaussianMixture(k, covariance_type=cov, random_state=seed).fit(x).n_iter_

    return steps, whole


def sklearn_fitter(x: np.ndarray, k: int, cov: str) -> tuple[Steps, Whole]:
    """scikit-learn's ``GaussianMixture``'s calls."""
    from sklearn.mixture import GaussianMixture

    weights, means, variance = start(x, k)
    given = dict(weights_init=weights, means_init=means, precisions_init=precisions_init(cov, k, x.shape[1], variance))

    def steps(m: int) -> None:
        GaussianMixture(k, covariance_type=cov, tol=0, max_iter=m, **given).fit(x)

    def whole(seed: int) -> int:
        return GaussianMixture(k, covariance_type=cov, random_state=seed).fit(x).n_iter_

    return steps, whole


POMEGRANATE_COV = {"full": "full", "diag": "diag", "spherical": "sphere"}


def pomegranate_fitter(x: np.ndarray, k: int, cov: str) -> tuple[Steps, Whole]:
    """pomegranate's ``GeneralMixtureModel`` of ``Normal``'s calls (no ``tied``: ``KeyError``)."""
    from pomegranate.distributions import Normal
    from pomegranate.gmm import GeneralMixtureModel

    weights, means, variance = start(x, k)
    d = x.shape[1]
    kind = POMEGRANATE_COV[cov]
    xt = torch.from_numpy(np.ascontiguousarray(x))

    def covs() -> torch.Tensor:
        if kind == "full":
            return torch.eye(d, dtype=torch.float64) * variance
        return torch.full((d,), variance, dtype=torch.float64)  # "sphere" too: its means' shape

    def steps(m: int) -> None:
        components = [Normal(torch.from_numpy(mu.copy()), covs(), covariance_type=kind) for mu in means]
        GeneralMixtureModel(components, priors=torch.from_numpy(weights), max_iter=m, tol=-math.inf).fit(xt)

    def whole(seed: int) -> int:
        components = [Normal(covariance_type=kind) for _ in range(k)]
        GeneralMixtureModel(components, random_state=seed).fit(xt)
        return -1  # pomegranate does not report its iterations

    return steps, whole


def torchgmm_fitter(x: np.ndarray, k: int, cov: str) -> tuple[Steps, Whole]:
    """torchgmm's ``GaussianMixture``'s calls (float32 data, a quiet CPU Lightning trainer)."""
    import logging

    from torchgmm.bayes import GaussianMixture

    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    logging.getLogger("pytorch_lightning").setLevel(logging.ERROR)
    _, means, _ = start(x, k)
    xt = torch.from_numpy(x.astype(np.float32))
    quiet = dict(enable_progress_bar=False, enable_model_summary=False, logger=False, accelerator="cpu")

    def steps(m: int) -> None:
        GaussianMixture(
            k,
            covariance_type=cov,
            init_means=torch.from_numpy(means.astype(np.float32)),
            convergence_tolerance=0.0,
            trainer_params=dict(max_epochs=m, **quiet),
        ).fit(xt)

    def whole(seed: int) -> int:
        torch.manual_seed(seed)  # its k-means start draws from torch's global generator
        gm = GaussianMixture(k, covariance_type=cov, trainer_params=dict(**quiet))
        gm.fit(xt)
        return int(gm.num_iter_)

    return steps, whole


# Each contender's modules, imported by load_modules before any thread limit is set.
MODULES = {
    "mixle_nb": ("mixle_nb.mixture",),
    "scikit-learn": ("sklearn.mixture",),
    "pomegranate": ("pomegranate.gmm", "pomegranate.distributions"),
    "torchgmm": ("torchgmm.bayes",),
}


def load_modules(libraries: Iterable[str]) -> None:
    """Import the contenders' modules now. ``threadpoolctl`` limits only the BLAS and OpenMP
    libraries loaded when the limit is set: one loaded later (scipy's own OpenBLAS, imported with
    scikit-learn) would run its first cell at the machine's thread count."""
    for library in libraries:
        for module in MODULES.get(library, ()):
            importlib.import_module(module)


FITTERS: dict[str, Callable[[np.ndarray, int, str], tuple[Steps, Whole]]] = {
    "mixle_nb": mixle_fitter,
    "scikit-learn": sklearn_fitter,
    "pomegranate": pomegranate_fitter,
    "torchgmm": torchgmm_fitter,
}
