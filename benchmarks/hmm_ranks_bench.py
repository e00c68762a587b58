"""One Baum–Welch iteration at 2 gloo ranks: mixle_nb's HMM family against mixle's HMM, both
stepped through our handle of whole sequences read where they sit, side by side in one run.

The data: ``--sequences`` sequences of ``--length`` steps (default 1,000 x 1,000; ``--quick``
300 x 500) of 1-D Gaussian emissions from an 8-state chain, saved once as a ``.npy`` of rows and
a ``.npy`` of lengths. Each rank builds two handles with ``TorchRunEncodedData.from_npy(path,
lengths=...)``: it reads only its own block of whole sequences (about half the rows) and encodes
it once, one handle with our family's encoder, one with mixle's. From the same start (8 states),
one iteration is timed on each, interleaved round by round, one thread a rank:

- ours: ``pysp_em_step`` with ``HiddenMarkovDistribution``'s estimator (the step
  ``GaussianHMM.fit`` takes on a handle: forward–backward over the packed sequences, the fold, the
  M-step), in both of hmmlearn's arithmetics, ``implementation="scaling"`` and ``"log"`` (the
  default of ``GaussianHMM``, as of hmmlearn's);
- mixle's: ``pysp_seq_estimate`` with mixle's ``HiddenMarkovModelEstimator`` (the step mixle's
  own dispatch calls on a handle), same data, same start.

One thread a rank for both: torch's, and numba's (mixle's E-step is a numba ``parallel=True``
kernel on numba's OpenMP layer, which by default runs as many threads as cores on every rank:
before this was set, mixle's step ran two threads a rank on two cores, its CPU time counting
the oversubscription and the workers' waiting). Each number is the least over ``--rounds`` rounds: the wall time of a step on rank 0 (the step
ends in a collective, so every rank waits for the slower) and, beside it, the larger of the two
ranks' CPU times (``time.process_time``; this machine is shared, and its wall clock counts other
people's work). The last columns check that the same iteration was timed: the largest
difference between the two one-step models' means, variances and transition matrices, and the
start's log-likelihood as each handle computes it. Target: ours at most 0.2x mixle's.
Peak memory per rank (``VmHWM``) is recorded too.

Run: ``OMP_NUM_THREADS=1 python benchmarks/hmm_ranks_bench.py [--quick]``; the tables go to
``benchmarks/results/hmm_ranks_bench.json`` (``--json PATH``), which the docs' benchmark page shows.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from typing import Any

import numpy as np
from results import Table, add_json_argument, write_results

from mixle_nb.parallel.local_launch import run_local

STATES = 8
IMPLEMENTATIONS = ("scaling", "log")  # ours: hmmlearn's two forward–backward arithmetics


def chain(states: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The truth: means spread over [-7, 7], unit variance, 0.9 to stay, the rest uniform."""
    transmat = np.full((states, states), 0.1 / (states - 1))
    np.fill_diagonal(transmat, 0.9)
    return np.full(states, 1 / states), transmat, np.linspace(-7.0, 7.0, states)


def sample(sequences: int, length: int, states: int, seed: int = 0) -> np.ndarray:
    """``sequences`` x ``length`` observations of the chain, drawn a time step at a time for every
    sequence at once; returned as rows, the sequences one after another."""
    rng = np.random.default_rng(seed)
    startprob, transmat, means = chain(states)
    cdf = np.cumsum(transmat, axis=1)
    z = np.empty((sequences, length), dtype=np.int64)
    z[:, 0] = rng.choice(states, size=sequences, p=startprob)
    for t in range(1, length):
        u = rng.random(sequences)[:, None]
        z[:, t] = np.minimum((u > cdf[z[:, t - 1]]).sum(axis=1), states - 1)
    return (means[z] + rng.standard_normal(z.shape)).reshape(-1)


def start(states: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, float]:
    """The start both libraries step from: means off by 0.4, variance 2, 0.5 to stay."""
    transmat = np.full((states, states), 0.5 / (states - 1))
    np.fill_diagonal(transmat, 0.5)
    return np.full(states, 1 / states), transmat, np.linspace(-7.0, 7.0, states) + 0.4, 2.0


def peak_mib() -> float:
    """This process's peak resident memory (``VmHWM``), MiB."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmHWM in /proc/self/status (Linux only)")


def _rank(rank: int, world: int, folder: str, states: int, rounds: int) -> dict:
    import mixle.stats as ms
    import numba
    import torch
    import torch.distributed as dist

    from mixle_nb.parallel import TorchRunEncodedData
    from mixle_nb.stats import GaussianDistribution
    from mixle_nb.stats.hmm import HiddenMarkovDistribution

    # one thread a rank, for both: mixle's E-step is a numba ``parallel=True`` kernel, which
    # otherwise runs numba's default thread count (the cores) on every rank, two ranks
    # oversubscribing the cores and its CPU time counting the OpenMP workers' spinning
    torch.set_num_threads(1)
    numba.set_num_threads(1)
    startprob, transmat, means, var = start(states)
    ours = {
        impl: HiddenMarkovDistribution([GaussianDistribution(m, var) for m in means], startprob, transmat, impl)
        for impl in IMPLEMENTATIONS
    }
    theirs = ms.HiddenMarkovModelDistribution([ms.GaussianDistribution(m, var) for m in means], startprob, transmat)
    estimators = {impl: model.estimator() for impl, model in ours.items()}
    estimators["mixle"] = theirs.estimator()
    path, lengths = f"{folder}/x.npy", f"{folder}/lengths.npy"
    handles = {name: TorchRunEncodedData.from_npy(path, estimators[name], lengths=lengths) for name in ("log", "mixle")}

    def ours_step(impl: str) -> Any:
        return lambda: handles["log"].pysp_em_step(estimators[impl], ours[impl]).model

    steps = {impl: ours_step(impl) for impl in IMPLEMENTATIONS}
    steps["mixle"] = lambda: handles["mixle"].pysp_seq_estimate(estimators["mixle"], theirs)
    models = {name: step() for name, step in steps.items()}  # warm-up
    wall = {name: float("inf") for name in steps}
    cpu = dict(wall)
    for _ in range(rounds):  # interleaved: the machine's noise hits all alike
        for name, step in steps.items():
            dist.barrier()
            w0, c0 = time.perf_counter(), time.process_time()
            models[name] = step()
            wall[name] = min(wall[name], time.perf_counter() - w0)
            cpu[name] = min(cpu[name], time.process_time() - c0)
    mine, other = models["scaling"], models["mixle"]
    differences = [
        np.abs(np.array([e.mu for e in mine.emissions]) - np.array([e.mu for e in other.topics])).max(),
        np.abs(np.array([e.sigma2 for e in mine.emissions]) - np.array([e.sigma2 for e in other.topics])).max(),
        np.abs(mine.transmat - np.asarray(other.transitions)).max(),
    ]
    log_likelihoods = [
        handles[name].pysp_seq_log_density_sum(m)[1] for name, m in (("log", ours["log"]), ("mixle", theirs))
    ]
    out = {
        "wall": wall,
        "cpu": cpu,
        "difference": [float(d) for d in differences],
        "log_likelihoods": log_likelihoods,
        "sequences": handles["log"].local_count,
        "peak_mib": peak_mib(),
    }
    for h in handles.values():
        h.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sequences", type=int, default=1_000)
    parser.add_argument("--length", type=int, default=1_000)
    parser.add_argument("--quick", action="store_true", help="300 sequences x 500 steps")
    parser.add_argument("--rounds", type=int, default=3)
    add_json_argument(parser, "hmm_ranks_bench")
    args = parser.parse_args()
    sequences, length = (300, 500) if args.quick else (args.sequences, args.length)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    with tempfile.TemporaryDirectory() as folder:
        np.save(f"{folder}/x.npy", sample(sequences, length, STATES))
        np.save(f"{folder}/lengths.npy", np.full(sequences, length))
        per_rank = run_local(_rank, 2, timeout=3600, folder=folder, states=STATES, rounds=args.rounds)
    size = f"{sequences:,} sequences x {length:,} steps, {STATES} states, 1-D Gaussian"
    table = Table(
        f"One Baum–Welch iteration at 2 ranks through our handle ({size}; best of {args.rounds})",
        ["ours", "wall ms", "mixle's wall ms", "wall ratio", "CPU ms", "mixle's CPU ms", "CPU ratio"],
    )
    wall = {name: per_rank[0]["wall"][name] for name in (*IMPLEMENTATIONS, "mixle")}
    cpu = {name: max(r["cpu"][name] for r in per_rank) for name in (*IMPLEMENTATIONS, "mixle")}
    for impl in IMPLEMENTATIONS:
        table.add(
            f'implementation="{impl}"',
            wall[impl] * 1e3,
            wall["mixle"] * 1e3,
            wall[impl] / wall["mixle"],
            cpu[impl] * 1e3,
            cpu["mixle"] * 1e3,
            cpu[impl] / cpu["mixle"],
        )
    check = Table(
        "The same iteration: the one-step models' largest differences (ours scaled) and the start's log-likelihood",
        [
            "means",
            "variances",
            "transitions",
            "log-likelihood, ours",
            "log-likelihood, mixle's",
            "sequences on rank 0, 1",
            "peak MiB rank 0, 1",
        ],
    )
    ours_ll, theirs_ll = per_rank[0]["log_likelihoods"]
    check.add(
        *(max(r["difference"][i] for r in per_rank) for i in range(3)),
        float(ours_ll),
        float(theirs_ll),
        f"{per_rank[0]['sequences']}, {per_rank[1]['sequences']}",
        f"{per_rank[0]['peak_mib']:.0f}, {per_rank[1]['peak_mib']:.0f}",
    )
    for t in (table, check):
        print(f"\n{t.title}")
        for row in t.rows:
            print("  ".join(f"{c}={v}" for c, v in zip(t.columns, row)))
    write_results(args.json, "hmm_ranks_bench", 1, [table, check])


if __name__ == "__main__":
    main()
