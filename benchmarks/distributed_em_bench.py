"""Per-step time of TorchRunEncodedData at 1, 2 and 4 ranks, both fold paths, side by side.

Workloads: N=1,000,000 K=8 1-D (E-step bound) and N=1,000 (the fixed per-step cost), plus a
raw gloo all_reduce of two float64 values as the floor. One thread per rank.
Run: .venv/bin/python benchmarks/distributed_em_bench.py [--big N]
"""
from __future__ import annotations

import argparse
import time

import numpy as np

from mixle_nb.parallel.local_launch import run_local


def _problem(n: int):
    from mixle_nb.stats import GaussianDistribution, MixtureDistribution

    rng = np.random.default_rng(0)
    means = np.linspace(-8, 8, 8)
    x = means[rng.integers(8, size=n)] + rng.standard_normal(n)
    start = MixtureDistribution([GaussianDistribution(m + 0.3, 1.0) for m in means], np.full(8, 1 / 8))
    return x, start


def _rank(rank, world, n, steps):
    import torch
    import torch.distributed as dist

    from mixle_nb.parallel import TorchRunEncodedData

    x, start = _problem(n)
    estimator = start.estimator()
    timings = {}
    for fold in ("gather", "allreduce"):
        handle = TorchRunEncodedData(x, estimator=estimator, fold=fold)
        handle.pysp_em_step(estimator, start)  # warm-up; also settles the fold path
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(steps):
            handle.pysp_em_step(estimator, start)
        timings[fold] = (time.perf_counter() - t0) / steps
        timings[f"{fold}_e_step"] = handle.last_timings.e_step_s
    two = torch.zeros(2, dtype=torch.float64)
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(steps):
        dist.all_reduce(two)
    timings["raw_all_reduce"] = (time.perf_counter() - t0) / steps
    dist.destroy_process_group()
    return timings


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--big", type=int, default=1_000_000)
    args = parser.parse_args()
    print(f"{'workload':<18}{'ranks':>6}{'gather ms':>11}{'allreduce ms':>14}{'E-step ms':>11}{'raw 2-value all_reduce ms':>27}")
    for n, steps in ((args.big, 5), (1_000, 200)):
        for world in (1, 2, 4):
            t = run_local(_rank, world, timeout=600, n=n, steps=steps)[0]
            print(f"{'N=' + str(n):<18}{world:>6}{t['gather'] * 1e3:>11.2f}{t['allreduce'] * 1e3:>14.2f}"
                  f"{t['allreduce_e_step'] * 1e3:>11.2f}{t['raw_all_reduce'] * 1e3:>27.3f}")


if __name__ == "__main__":
    main()
