"""Per-iteration EM time: mixle_nb against scikit-learn and a hand-written torch iteration;
and the initialisation: k-means‖ on 1 and 2 ranks against scikit-learn's k-means++ seeding
and KMeans start, in EM steps (target: at most 3).

Same data, same start, measured side by side in one run (this machine is shared and noisy:
compare the ratios, not the absolute numbers). Run: .venv/bin/python benchmarks/em_bench.py
(``--only init`` for the initialisation alone). ``--baseline DIR`` (repeatable): also time the
EM step of the mixle_nb in another checkout (e.g. ``git worktree add /tmp/base main``),
interleaved with this one's, to compare a change before and after in the same run.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import math
import os
import sys
import time
import warnings

import numpy as np
import torch
from results import Table, add_json_argument, write_results

from mixle_nb.stats import (
    GaussianDistribution,
    GaussianEstimator,
    MixtureDistribution,
    MixtureEstimator,
    MultivariateGaussianDistribution,
    MultivariateGaussianEstimator,
    seq_encode,
    seq_estimate,
)


def load_baseline(checkout: str, name: str):
    """The ``stats`` package of the mixle_nb in ``checkout``, imported as package ``name``."""
    package = os.path.join(os.path.abspath(checkout), "mixle_nb")
    spec = importlib.util.spec_from_file_location(
        name, os.path.join(package, "__init__.py"), submodule_search_locations=[package]
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return importlib.import_module(f"{name}.stats")


def baseline_step(stats, x: np.ndarray, dim: int, k: int, start_means: np.ndarray):
    """One EM step of the baseline's ``seq_estimate`` from the same start, as a callable."""
    if dim == 1:
        comps = [stats.GaussianDistribution(m[0], 1.0) for m in start_means]
        estimator = stats.MixtureEstimator([stats.GaussianEstimator() for _ in range(k)])
    else:
        comps = [stats.MultivariateGaussianDistribution(m, np.eye(dim)) for m in start_means]
        estimator = stats.MixtureEstimator([stats.MultivariateGaussianEstimator(dim) for _ in range(k)])
    start = stats.MixtureDistribution(comps, np.full(k, 1.0 / k))
    enc = stats.seq_encode(x, model=start)
    return lambda: stats.seq_estimate(enc, estimator, start)


def start_model(dim: int, k: int, rng: np.random.Generator):
    means = rng.normal(0, 3, size=(k, dim))
    if dim == 1:
        comps = [GaussianDistribution(m[0], 1.0) for m in means]
    else:
        comps = [MultivariateGaussianDistribution(m, np.eye(dim)) for m in means]
    return MixtureDistribution(comps, np.full(k, 1.0 / k)), means


def make_data(n: int, dim: int, k: int):
    """Data from a K-component mixture, and a start whose means are the true ones, perturbed."""
    truth, means = start_model(dim, k, np.random.default_rng(0))
    x = truth.sampler(1).sample(n)
    start, _ = start_model(dim, k, np.random.default_rng(1))
    start_means = means + np.random.default_rng(2).normal(0, 0.5, size=means.shape)
    if dim == 1:
        comps = [GaussianDistribution(m[0], 1.0) for m in start_means]
    else:
        comps = [MultivariateGaussianDistribution(m, np.eye(dim)) for m in start_means]
    return (x if dim > 1 else x.reshape(-1)), MixtureDistribution(comps, np.full(k, 1.0 / k)), start_means


def torch_iteration(x: torch.Tensor, w, mu, cov):
    """A minimal vectorized EM iteration in float64: log-sum-exp responsibilities, weighted sums."""
    n, d = x.shape
    chol = torch.linalg.cholesky(cov)  # (K, D, D)
    diff = x[None] - mu[:, None, :]  # (K, N, D)
    z = torch.linalg.solve_triangular(chol, diff.transpose(1, 2), upper=False)  # (K, D, N)
    log_det = torch.log(torch.diagonal(chol, dim1=1, dim2=2)).sum(1)
    lp = (-0.5 * z.square().sum(1) - log_det[:, None] - 0.5 * d * math.log(2 * math.pi)).T + torch.log(w)
    lse = torch.logsumexp(lp, dim=1, keepdim=True)
    resp = torch.exp(lp - lse)
    nk = resp.sum(0)
    mu_new = (resp.T @ x) / nk[:, None]
    cov_new = torch.einsum("nk,nd,ne->kde", resp, x, x) / nk[:, None, None] - mu_new[:, :, None] * mu_new[:, None, :]
    return nk / n, mu_new, cov_new, lse.sum()


def torch_iteration_1d(x: torch.Tensor, w, mu, var):
    lp = -0.5 * ((x[:, None] - mu) ** 2 / var + torch.log(2 * math.pi * var)) + torch.log(w)
    lse = torch.logsumexp(lp, dim=1, keepdim=True)
    resp = torch.exp(lp - lse)
    nk = resp.sum(0)
    mu_new = (resp.T @ x) / nk
    var_new = (resp.T @ (x * x)) / nk - mu_new**2
    return nk / len(x), mu_new, var_new, lse.sum()


def interleaved_best(fns: dict, repeats: int, settle_s: float = 0.25) -> dict:
    """Best time of each function over ``repeats`` rounds, one call of each per round, so a
    noisy stretch of the shared machine hits every contender alike. Each call waits
    ``settle_s`` first: the previous contender's thread pool (OpenBLAS under scikit-learn,
    OpenMP under torch) keeps spinning after it returns, and a call that starts at once
    shares the cores with it (twice as slow, measured here)."""
    times = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            time.sleep(settle_s)
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    return {name: min(t) for name, t in times.items()}


def run(n: int, dim: int, k: int, repeats: int, baselines=()) -> dict:
    from sklearn.mixture import GaussianMixture

    x, start, means = make_data(n, dim, k)
    estimator = MixtureEstimator(
        [GaussianEstimator() if dim == 1 else MultivariateGaussianEstimator(dim) for _ in range(k)]
    )
    enc = seq_encode(x, model=start)

    xt = torch.from_numpy(x.reshape(n, dim))
    w0 = torch.full((k,), 1.0 / k, dtype=torch.float64)
    mu0 = torch.from_numpy(means)
    if dim == 1:
        xt1 = xt[:, 0].contiguous()
        var0 = torch.ones(k, dtype=torch.float64)
        hand = lambda: torch_iteration_1d(xt1, w0, mu0[:, 0], var0)  # noqa: E731
    else:
        cov0 = torch.eye(dim, dtype=torch.float64).expand(k, dim, dim).contiguous()
        hand = lambda: torch_iteration(xt, w0, mu0, cov0)  # noqa: E731

    x2 = x.reshape(n, dim)
    gm_kwargs = dict(
        n_components=k,
        covariance_type="full",
        weights_init=np.full(k, 1.0 / k),
        means_init=means,
        precisions_init=np.tile(np.eye(dim), (k, 1, 1)),
        reg_covar=0.0,
    )
    iters = 3
    contenders = {
        "mixle": lambda: seq_estimate(enc, estimator, start),
        "torch": hand,
        "sklearn_one": lambda: GaussianMixture(max_iter=1, tol=0, **gm_kwargs).fit(x2),
        "sklearn_more": lambda: GaussianMixture(max_iter=1 + iters, tol=0, **gm_kwargs).fit(x2),
    }
    for i, baseline in enumerate(baselines):
        contenders[f"baseline{i}"] = baseline_step(baseline, x, dim, k, means)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        best = interleaved_best(contenders, repeats)
    # per-iteration cost, without fit()'s set-up and final E-step
    best["sklearn"] = (best["sklearn_more"] - best["sklearn_one"]) / iters
    return best


def init_on_ranks(rank: int, world: int, n: int, dim: int, k: int, repeats: int) -> dict:
    """Best k-means‖ start and best EM step of this rank's share of the same data (run_local)."""
    from mixle_nb.parallel import TorchRunEncodedData

    x, _, _ = make_data(n, dim, k)
    estimator = MixtureEstimator([MultivariateGaussianEstimator(dim) for _ in range(k)])
    with TorchRunEncodedData(x, estimator=estimator) as handle:
        model = handle.pysp_kmeans_init(estimator, 0)
        times = {"init": [], "em": []}
        for seed in range(repeats):
            t0 = time.perf_counter()
            handle.pysp_kmeans_init(estimator, seed)
            t1 = time.perf_counter()
            handle.pysp_em_step(estimator, model)
            times["init"].append(t1 - t0)
            times["em"].append(time.perf_counter() - t1)
    return {name: min(t) for name, t in times.items()}


def run_init(n: int, dim: int, k: int, repeats: int) -> dict:
    """k-means‖ on 1 and 2 ranks (one thread each), each against that run's EM step; then,
    interleaved in this process on one thread, k-means‖ on local data, an EM step,
    scikit-learn's k-means++ seeding and the KMeans fit GaussianMixture starts from."""
    from sklearn.cluster import KMeans, kmeans_plusplus
    from threadpoolctl import threadpool_limits

    from mixle_nb.parallel.local_launch import run_local

    found = {
        f"{world} rank": run_local(init_on_ranks, world, timeout=1800, n=n, dim=dim, k=k, repeats=repeats)[0]
        for world in (1, 2)
    }
    from mixle_nb.inference import initial_model
    from mixle_nb.stats import em_step

    x, start, _ = make_data(n, dim, k)
    estimator = MixtureEstimator([MultivariateGaussianEstimator(dim) for _ in range(k)])
    enc = seq_encode(x, estimator=estimator)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    with threadpool_limits(1), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        found["local"] = interleaved_best(
            {
                "init": lambda: initial_model(enc, estimator, "kmeans++", rng=0),
                "em": lambda: em_step(enc, estimator, start),
                "kmeans++": lambda: kmeans_plusplus(x, k, random_state=0),
                "kmeans": lambda: KMeans(k, n_init=1, random_state=0).fit(x),
            },
            repeats,
        )
    torch.set_num_threads(threads)
    return found


def init_quality(seeds: int = 10) -> list:
    """Per dataset of the tests' ten separated mixtures: how many seeds of each start reach
    scikit-learn's default fit (within 1e-6 relative) after EM, on local data."""
    import os
    import sys

    from sklearn.mixture import GaussianMixture

    from mixle_nb.inference import fit

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
    from separated_mixtures import datasets  # the datasets tests/test_init.py asserts on

    rows = []
    for ds in datasets():
        x = ds.x.reshape(len(ds.x), -1)
        gm = GaussianMixture(ds.k, covariance_type=ds.sklearn_covariance, random_state=0).fit(x)
        reference = gm.score(x) * len(x)
        enc = seq_encode(ds.x, estimator=ds.estimator())
        reached = {}
        for init in ("kmeans++", "random_from_data", "random"):
            finals = [
                fit(None, ds.estimator(), enc_data=enc, init=init, rng=seed, out=None, max_its=500).log_density
                for seed in range(seeds)
            ]
            reached[init] = sum(f >= reference - 1e-6 * abs(reference) for f in finals)
        rows.append((ds.name, reached))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=10, help="rounds; each contender keeps its best")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--scale", type=float, default=1.0, help="multiply the N of each workload")
    parser.add_argument("--only", choices=("em", "init"), help="run only the EM or the initialisation workloads")
    parser.add_argument(
        "--baseline",
        metavar="DIR",
        action="append",
        default=[],
        help="also time the EM step of the mixle_nb checked out in DIR (repeatable)",
    )
    add_json_argument(parser, "em_bench")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    tables = []
    baselines = [load_baseline(path, f"mixle_nb_baseline{i}") for i, path in enumerate(args.baseline)]
    for i, path in enumerate(args.baseline):
        print(f"baseline{i}: {path}")
    if args.only != "init":
        print(f"torch threads: {torch.get_num_threads()}")
        extra = "".join(f"{f'baseline{i} ms':>14}{f'baseline{i}/torch':>17}" for i in range(len(baselines)))
        print(
            f"{'workload':<24}{'mixle ms':>10}{'torch ms':>10}{'sklearn ms':>12}{'mixle/torch':>13}"
            f"{'mixle/sklearn':>15}{extra}"
        )
        em = Table(
            "One EM iteration (ms, best of the rounds)",
            ["workload", "mixle_nb ms", "torch ms", "scikit-learn ms", "mixle_nb / torch", "mixle_nb / scikit-learn"]
            + [f"baseline{i} ms" for i in range(len(baselines))],
        )
        tables.append(em)
        for n, dim, k in [(1_000_000, 1, 8), (200_000, 8, 8)]:
            n = int(n * args.scale)
            r = run(n, dim, k, args.repeats, baselines)
            name = f"N={n} D={dim} K={k}"
            extra = "".join(
                f"{r[f'baseline{i}'] * 1e3:>14.1f}{r[f'baseline{i}'] / r['torch']:>17.2f}"
                for i in range(len(baselines))
            )
            print(
                f"{name:<24}{r['mixle'] * 1e3:>10.1f}{r['torch'] * 1e3:>10.1f}{r['sklearn'] * 1e3:>12.1f}"
                f"{r['mixle'] / r['torch']:>13.2f}{r['mixle'] / r['sklearn']:>15.3f}{extra}"
            )
            em.add(
                name,
                r["mixle"] * 1e3,
                r["torch"] * 1e3,
                r["sklearn"] * 1e3,
                r["mixle"] / r["torch"],
                r["mixle"] / r["sklearn"],
                *(r[f"baseline{i}"] * 1e3 for i in range(len(baselines))),
            )
    if args.only != "em":
        n, dim, k = int(1_000_000 * args.scale), 8, 8
        r = run_init(n, dim, k, max(1, args.repeats // 2))
        print(f"\nInitialisation, N={n} D={dim} K={k}, one thread per rank (best of {max(1, args.repeats // 2)}):")
        print(f"{'':<30}{'init ms':>10}{'EM step ms':>12}{'init / EM step':>16}")
        init = Table(
            f"The start, N={n} D={dim} K={k}, in EM steps", ["start", "init ms", "EM step ms", "init / EM step"]
        )
        tables.append(init)
        for world, label in (("1 rank", "k-means‖, 1 rank"), ("2 rank", "k-means‖, 2 ranks")):
            t = r[world]
            print(f"{label:<30}{t['init'] * 1e3:>10.1f}{t['em'] * 1e3:>12.1f}{t['init'] / t['em']:>16.2f}")
            init.add(label, t["init"] * 1e3, t["em"] * 1e3, t["init"] / t["em"])
        local = r["local"]
        print("interleaved in this process (local data):")
        for name, label in (
            ("init", "k-means‖ (local data)"),
            ("kmeans++", "sklearn kmeans_plusplus"),
            ("kmeans", "sklearn KMeans (GMM's start)"),
        ):
            print(f"{label:<30}{local[name] * 1e3:>10.1f}{local['em'] * 1e3:>12.1f}{local[name] / local['em']:>16.2f}")
            init.add(f"{label}, in this process", local[name] * 1e3, local["em"] * 1e3, local[name] / local["em"])
        print("\nSeeds of 10 whose EM reaches scikit-learn's default fit (tests' ten datasets):")
        print(f"{'dataset':<18}{'kmeans++':>10}{'random_from_data':>18}{'random':>8}")
        quality = Table(
            "Seeds of 10 whose EM reaches scikit-learn's default fit",
            ["dataset", "kmeans++", "random_from_data", "random"],
        )
        tables.append(quality)
        for name, reached in init_quality():
            print(f"{name:<18}{reached['kmeans++']:>10}{reached['random_from_data']:>18}{reached['random']:>8}")
            quality.add(name, reached["kmeans++"], reached["random_from_data"], reached["random"])
    write_results(args.json, "em_bench", args.threads, tables)


if __name__ == "__main__":
    main()
