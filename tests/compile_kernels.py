"""Compile the package's numba kernels into their disk cache before ``make test``'s lanes start.

A kernel's first compilation costs 15-20 s of CPU (the fused small mixture step, the HMM passes);
once it is cached, a process loads it in under a second. Without this, the first processes of
both lanes, and the engines and ranks they start, each compile the same kernels at once on a
clean checkout. Tiny fits of every covariance type and both HMM implementations reach every
kernel the suite runs."""

from __future__ import annotations

import warnings

import numpy as np
from sklearn.exceptions import ConvergenceWarning

from mixle_nb.hmm import CategoricalHMM, GaussianHMM
from mixle_nb.mixture import GaussianMixture


def main() -> None:
    x = np.random.default_rng(0).normal(size=(60, 2))
    wide = np.random.default_rng(0).normal(size=(60, 20))  # the tied and full steps' compiled posterior
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        for covariance_type in ("full", "diag", "spherical", "tied"):
            GaussianMixture(2, covariance_type=covariance_type, max_iter=2, random_state=0).fit(x)
        for covariance_type in ("full", "tied"):
            GaussianMixture(2, covariance_type=covariance_type, max_iter=2, random_state=0).fit(wide)
    for implementation in ("scaling", "log"):
        GaussianHMM(2, implementation=implementation, n_iter=2, random_state=0).fit(x[:, :1], [30, 30])
        labels = (x[:, :1] > 0).astype(int)
        CategoricalHMM(2, implementation=implementation, n_iter=2, random_state=0).fit(labels, [30, 30])


if __name__ == "__main__":
    main()
