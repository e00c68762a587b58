"""The float32 E-step against the float64 one on this CPU (issue 39): seconds per EM iteration
and the bytes of the encoded data, side by side in one run.

Workloads: 1-D (N = 1e6, K = 8), diagonal and full covariance (N = 1e6, D = 8, K = 8), and the
Bayesian mixture's variational iteration on the full-covariance data (``BayesianGaussianMixture``'s
E-step and update, a Dirichlet-process prior), each from the same start in both dtypes; an iteration is one ``em_step`` on a resident encoding
(the set-up, encoding included, is not timed). Rounds interleave the two dtypes and the best
round counts, in wall time and in the process's CPU time (this machine is shared: the CPU time
is the steadier under load; compare the ratios). The float32 fit's agreement with
the float64 fit after the timed iterations is printed beside (largest difference of the
means, in spreads). Run: .venv/bin/python benchmarks/dtype_bench.py [--threads 1] [--n 1e6]
[--quick]; the results go to benchmarks/results/dtype_bench.json (the docs' benchmark page).
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch
from results import Table, add_json_argument, write_results

from mixle_nb.stats import (
    DiagonalGaussianDistribution,
    DiagonalGaussianEstimator,
    GaussianDistribution,
    GaussianEstimator,
    MixtureDistribution,
    MixtureEstimator,
    MultivariateGaussianDistribution,
    MultivariateGaussianEstimator,
    em_step,
    seq_encode,
)
from mixle_nb.stats.variational_gaussian import (
    VariationalGaussianMixture,
    VariationalGaussianMixtureEstimator,
    VariationalPriors,
)

CASES = (("1-D", 1), ("diag", 8), ("full", 8), ("bayesian full", 8))


def problem(n: int, dim: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """``n`` points from ``k`` unit-variance components and a start: the true means moved."""
    rng = np.random.default_rng(0)
    means = np.linspace(-8, 8, k)[:, None] if dim == 1 else rng.normal(0, 3, size=(k, dim))
    x = means[rng.integers(k, size=n)] + rng.standard_normal((n, dim))
    return (x[:, 0] if dim == 1 else x), means + rng.normal(0, 0.5, size=means.shape)


def estimator_and_start(kind: str, dim: int, start_means: np.ndarray, dtype: str):
    """The mixture estimator in ``dtype`` and the start (unit variances, equal weights; the
    Bayesian mixture's: unit Wishart scales, even stick-breaking posteriors)."""
    k = len(start_means)
    if kind == "bayesian full":
        priors = VariationalPriors(
            "full", "dirichlet_process", 1.0 / k, 1.0, np.zeros(dim), float(dim), 10 * np.eye(dim), 1e-6
        )
        start = VariationalGaussianMixture(
            priors,
            (np.ones(k), np.ones(k)),
            np.ones(k),
            start_means,
            np.full(k, float(dim)),
            np.stack([np.eye(dim)] * k),
        )
        return VariationalGaussianMixtureEstimator(k, dim, priors, dtype), start
    if kind == "1-D":
        components = [GaussianDistribution(m[0], 1.0) for m in start_means]
        estimators = [GaussianEstimator(dtype=dtype) for _ in range(k)]
    elif kind == "diag":
        components = [DiagonalGaussianDistribution(m, np.ones(dim)) for m in start_means]
        estimators = [DiagonalGaussianEstimator(dim, dtype=dtype) for _ in range(k)]
    else:
        components = [MultivariateGaussianDistribution(m, np.eye(dim)) for m in start_means]
        estimators = [MultivariateGaussianEstimator(dim, dtype=dtype) for _ in range(k)]
    return MixtureEstimator(estimators), MixtureDistribution(components, np.full(k, 1.0 / k))


class Chain:
    """Successive EM iterations on one resident encoding, each from the previous model."""

    def __init__(self, x: np.ndarray, kind: str, dim: int, start_means: np.ndarray, dtype: str):
        self.estimator, self.model = estimator_and_start(kind, dim, start_means, dtype)
        self.enc = seq_encode(x, estimator=self.estimator)

    def bytes(self) -> int:
        tensors = [self.enc.values] + ([] if self.enc.features is None else [self.enc.features])
        return sum(t.element_size() * t.nelement() for t in tensors)

    def step(self) -> None:
        self.model = em_step(self.enc, self.estimator, self.model).model


def means(model: MixtureDistribution) -> np.ndarray:
    return np.stack([np.atleast_1d(c.mu) for c in model.components])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--n", type=float, default=1e6)
    parser.add_argument("--k", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--iterations", type=int, default=3, help="EM iterations timed per round")
    parser.add_argument("--quick", action="store_true", help="N = 1e5, 2 rounds (a smoke run)")
    add_json_argument(parser, "dtype_bench")
    args = parser.parse_args()
    n = int(1e5 if args.quick else args.n)
    rounds = 2 if args.quick else args.rounds
    torch.set_num_threads(args.threads)
    table = Table(
        f"EM per iteration, float64 against float32 E-step (N = {n:.0e}, K = {args.k}, {args.threads} thread(s))",
        [
            "case",
            "D",
            "float64 ms",
            "float32 ms",
            "float32 / float64",
            "float64 CPU ms",
            "float32 CPU ms",
            "CPU float32 / float64",
            "float64 MB",
            "float32 MB",
            "means diff",
        ],
    )
    for kind, dim in CASES:
        x, start_means = problem(n, dim, args.k)
        chains = {dtype: Chain(x, kind, dim, start_means, dtype) for dtype in ("float64", "float32")}
        for chain in chains.values():
            chain.step()  # warm-up
        best = dict.fromkeys(chains, float("inf"))
        cpu = dict.fromkeys(chains, float("inf"))
        for _ in range(rounds):
            for dtype, chain in chains.items():
                start, start_cpu = time.perf_counter(), time.process_time()
                for _ in range(args.iterations):
                    chain.step()
                best[dtype] = min(best[dtype], (time.perf_counter() - start) / args.iterations)
                cpu[dtype] = min(cpu[dtype], (time.process_time() - start_cpu) / args.iterations)
        wide, narrow = chains["float64"], chains["float32"]
        difference = float(np.max(np.abs(means(wide.model) - means(narrow.model))))
        table.add(
            kind,
            dim,
            best["float64"] * 1e3,
            best["float32"] * 1e3,
            best["float32"] / best["float64"],
            cpu["float64"] * 1e3,
            cpu["float32"] * 1e3,
            cpu["float32"] / cpu["float64"],
            wide.bytes() / 2**20,
            narrow.bytes() / 2**20,
            difference,
        )
        print(dict(zip(table.columns, table.rows[-1])), flush=True)
    write_results(args.json, "dtype_bench", args.threads, [table])


if __name__ == "__main__":
    main()
