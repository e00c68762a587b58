"""``GaussianMixture.fit`` wall time: mixle_nb.mixture against scikit-learn, same data, same
start (``weights_init``, ``means_init``, ``precisions_init``) and the same iterations
(``tol=0``, fixed ``max_iter``), side by side in one run, and ours on a 2-rank cluster whose
ranks read their rows of the same data from a ``.npy`` (``fit(mixle.handle("h"))``, the round
trip included). Target: ours at most 0.1x scikit-learn's time in one process.

Run: .venv/bin/python benchmarks/sklearn_api_bench.py  (``--quick`` for a small smoke run;
``--no-cluster`` to skip the cluster; ``--baseline DIR``: also the fit of the mixle_nb in another
checkout, interleaved, for a change's before and after). This machine is shared and noisy:
compare the ratios.

``--interactive``: the sizes a notebook steps at instead (N = 1,000, D = 2, K = 3, full, one
thread, this thread's CPU time, so other processes' time on a shared machine drops out, and so
does the panel's redraw, which runs on a timer thread of its own, throttled to a share of a core): one
EM iteration of ours and of scikit-learn's (fits of 2 and 2 + ``--steps`` iterations from the
same start, differenced), and one step of a local ``EMPanel`` (no cluster: the panel's own
in-process rank), into ``benchmarks/results/sklearn_interactive_bench.json``. Target: the
panel's step no slower than scikit-learn's iteration.
"""

from __future__ import annotations

import argparse
import importlib
import os
import tempfile
import time
import warnings

import numpy as np
import torch
from results import Table, add_json_argument, write_results
from sklearn.exceptions import ConvergenceWarning
from sklearn.mixture import GaussianMixture as ScikitGaussianMixture
from threadpoolctl import threadpool_limits

from mixle_nb.mixture import GaussianMixture

ATTRIBUTES = ("weights_", "means_", "covariances_", "lower_bound_")
# The previous contender's thread pool (OpenBLAS under scikit-learn, OpenMP under torch) keeps
# spinning for a moment after it returns; a fit that starts at once shares the cores with it.
SETTLE_S = 0.25


def problem(n: int, d: int, k: int, seed: int = 0):
    """Data from K overlapping Gaussians and a start near (not at) them."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(0, 3, size=(k, d))
    x = centres[rng.integers(k, size=n)] + rng.normal(size=(n, d))
    start = dict(
        weights_init=np.full(k, 1 / k),
        means_init=centres + rng.normal(0, 0.5, size=(k, d)),
        precisions_init=np.stack([np.eye(d)] * k),
    )
    return x, start


def timed_fit(estimator, data) -> tuple[float, object]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        time.sleep(SETTLE_S)
        t0 = time.perf_counter()
        estimator.fit(data)
        return time.perf_counter() - t0, estimator


def largest_difference(a, b) -> float:
    return max(
        float(
            np.max(
                np.abs(np.asarray(getattr(a, n)) - np.asarray(getattr(b, n)))
                / np.maximum(np.abs(np.asarray(getattr(a, n))), 1e-300)
            )
        )
        for n in ATTRIBUTES
    )


def cpu_seconds(call) -> float:
    """This thread's CPU time of ``call()`` (one thread: its work), after the settle pause."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        time.sleep(SETTLE_S)
        t0 = time.thread_time()
        call()
        return time.thread_time() - t0


def interactive(rounds: int, steps: int) -> Table:
    """Per-iteration and panel-step CPU ms at N = 1,000, D = 2, K = 3 (full), best of ``rounds``
    interleaved rounds."""
    from mixle_nb.widgets import EMPanel

    x, start = problem(1_000, 2, 3)
    settings = dict(n_components=3, covariance_type="full", tol=0, **start)

    def iteration(estimator) -> float:
        low = cpu_seconds(lambda: estimator(max_iter=2, **settings).fit(x))
        high = cpu_seconds(lambda: estimator(max_iter=2 + steps, **settings).fit(x))
        return (high - low) / steps

    model = GaussianMixture(max_iter=1, **settings).fit(x)._model()  # the fit's start, as a model
    panel = EMPanel(handle=x, estimator=GaussianMixture(3).mixture_estimator(2), model=model)
    panel.step()  # the first step builds what the panel keeps
    times: dict[str, list[float]] = {"scikit-learn": [], "mixle_nb": [], "panel": []}
    for _ in range(rounds):
        times["scikit-learn"].append(iteration(ScikitGaussianMixture))
        times["mixle_nb"].append(iteration(GaussianMixture))
        times["panel"].append(cpu_seconds(lambda: [panel.step() for _ in range(steps)]) / steps)
    best = {name: 1e3 * min(t) for name, t in times.items()}
    table = Table(
        f"N = 1,000, D = 2, K = 3 (full), one thread: CPU ms a step, best of {rounds} rounds of {steps} steps",
        ["step", "ms", "scikit-learn iteration ms", "ours / scikit-learn's"],
    )
    table.add(
        "mixle_nb EM iteration (GaussianMixture.fit, differenced)",
        best["mixle_nb"],
        best["scikit-learn"],
        best["mixle_nb"] / best["scikit-learn"],
    )
    table.add(
        "local EMPanel.step (no cluster)", best["panel"], best["scikit-learn"], best["panel"] / best["scikit-learn"]
    )
    print(*(f"{row[0]}: {row[1]:.3f} ms against {row[2]:.3f} ms ({row[3]:.2f}x)" for row in table.rows), sep="\n")
    return table


def on_cluster(cluster, x, settings) -> float:
    """Ours on the cluster's ranks, each reading its rows of ``x`` from a ``.npy`` file."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "x.npy")
        np.save(path, x)
        estimator = GaussianMixture(**settings)
        cluster.push(path=path, est=estimator.mixture_estimator(x.shape[1]))
        cluster.execute_async(
            "from mixle_nb.parallel import TorchRunEncodedData\n"
            "h_bench = TorchRunEncodedData.from_npy(path, estimator=est)"
        ).result()
        try:
            seconds, _ = timed_fit(estimator, cluster.handle("h_bench"))
        finally:
            cluster.execute_async("h_bench.close(); del h_bench").result()
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=2, help="interleaved rounds; the best of each is kept")
    parser.add_argument("--quick", action="store_true", help="N / 100, for a smoke run")
    parser.add_argument("--no-cluster", action="store_true")
    parser.add_argument(
        "--baseline", metavar="DIR", help="also time the GaussianMixture of the mixle_nb checked out in DIR"
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="threads of each library in this process (torch's and scikit-learn's BLAS); "
        "on a loaded machine 2 threads' spin barriers slow both down many times over",
    )
    parser.add_argument("--interactive", action="store_true", help="the per-step costs at N = 1,000 instead")
    parser.add_argument("--steps", type=int, default=50, help="--interactive: steps differenced or timed a round")
    add_json_argument(parser, "sklearn_api_bench")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    threadpool_limits(args.threads)
    if args.interactive:
        json_path = args.json
        if json_path == parser.get_default("json"):
            json_path = json_path.with_name("sklearn_interactive_bench.json")
        table = interactive(args.rounds, args.steps)
        write_results(json_path, "sklearn_api_bench", args.threads, [table])  # the command names this script
        return
    table = Table(
        f"GaussianMixture.fit, {args.iterations} EM iterations from the same start (s, best of {args.rounds})",
        [
            "case",
            "scikit-learn s",
            "mixle_nb s",
            "mixle_nb / scikit-learn",
            "2-rank cluster s",
            "largest relative difference",
        ]
        + (["baseline s", "baseline / scikit-learn"] if args.baseline else []),
    )
    cases = [("full", 1_000_000, 8, 8), ("full", 10_000_000, 1, 8)]
    baseline = None
    if args.baseline:
        from em_bench import load_baseline  # this folder is on the path of a script run from it

        load_baseline(args.baseline, "mixle_nb_baseline")
        baseline = importlib.import_module("mixle_nb_baseline.mixture").GaussianMixture
    cluster = None
    if not args.no_cluster:
        from mixle_nb.cluster import MixleCluster

        cluster = MixleCluster(2, timeout=600.0).start()
    try:
        print(
            f"fit, {args.iterations} EM iterations from the same start, best of {args.rounds} rounds, "
            f"{args.threads} thread(s) in this process, 1 a rank on the cluster"
        )
        extra = f" {'baseline s':>11} {'baseline ratio':>15}" if baseline else ""
        print(
            f"{'case':>24} {'scikit-learn s':>15} {'ours s':>8} {'ratio':>7} {'2-rank cluster s':>17} "
            f"{'max rel diff':>13}{extra}"
        )
        for covariance_type, n, d, k in cases:
            n = n // 100 if args.quick else n
            x, start = problem(n, d, k)
            settings = dict(n_components=k, covariance_type=covariance_type, tol=0, max_iter=args.iterations, **start)
            theirs, ours, cluster_s, before = [], [], [], []
            for _ in range(args.rounds):
                t, reference = timed_fit(ScikitGaussianMixture(**settings), x)
                theirs.append(t)
                t, fitted = timed_fit(GaussianMixture(**settings), x)
                ours.append(t)
                if baseline is not None:
                    before.append(timed_fit(baseline(**settings), x)[0])
                if cluster is not None:
                    cluster_s.append(on_cluster(cluster, x, settings))
            clustered = f"{min(cluster_s):17.2f}" if cluster_s else f"{'-':>17}"
            name = f"N={n:.0e} D={d} K={k} {covariance_type}"
            extra = f" {min(before):11.2f} {min(before) / min(theirs):15.3f}" if before else ""
            print(
                f"{name:>24} {min(theirs):15.2f} {min(ours):8.2f} {min(ours) / min(theirs):7.3f} {clustered} "
                f"{largest_difference(reference, fitted):13.1e}{extra}",
                flush=True,
            )
            table.add(
                name,
                min(theirs),
                min(ours),
                min(ours) / min(theirs),
                min(cluster_s) if cluster_s else None,
                largest_difference(reference, fitted),
                *((min(before), min(before) / min(theirs)) if before else ()),
            )
        write_results(args.json, "sklearn_api_bench", args.threads, [table])
    finally:
        if cluster is not None:
            cluster.stop()


if __name__ == "__main__":
    main()
