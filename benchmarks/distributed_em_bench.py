"""Per-step time of TorchRunEncodedData at 1, 2 and 4 ranks, both fold paths, side by side.

Workloads: N=1,000,000 K=8 1-D (E-step bound) and N=1,000 (the fixed per-step cost), plus a
raw gloo all_reduce of two float64 values as the floor. One thread per rank.
Then mixle's hidden Markov model over ragged sequences on 2 ranks: per-step time of our handle
against mixle's own TorchRunEncodedData, same data and start, interleaved in one process group
(the step mixle's dispatch calls, ``pysp_seq_estimate``; target: at most 0.5x mixle's), beside
mixle's own E-step and M-step on one rank's shard with no handle, which both handles share.
Then the fold in logical-shard order (issue 30) at 4 ranks beside today's rank-order fold: the
fold seconds of a step of the in-memory handle (one shard per rank) and of a ``from_npy``
handle with one and two shards per rank, against the old fold's work (one all-to-all of the
rank's summed statistics, added in rank order, restored into the accumulator), each as a share
of the step; target: the shard-order fold adds at most 10% of a step.
Run: .venv/bin/python benchmarks/distributed_em_bench.py [--big N] [--hmm-sequences S] [--worlds 1,2,4] [--no-hmm]
     [--fold-only]
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from results import Table, add_json_argument, write_results

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


def _fold_rank(rank, world, n, steps, path):
    import torch.distributed as dist

    from mixle_nb.parallel import TorchRunEncodedData
    from mixle_nb.parallel.fail_together import agreement_slots, fingerprint
    from mixle_nb.stats.estimation import accumulate
    from mixle_nb.stats.values import flatten_value

    x, start = _problem(n)
    estimator = start.estimator()
    handles = {
        "in memory, 1 shard/rank": TorchRunEncodedData(x, estimator=estimator),
        "from_npy, 1 shard/rank": TorchRunEncodedData.from_npy(path, estimator),
        "from_npy, 2 shards/rank": TorchRunEncodedData.from_npy(path, estimator, shards=2 * world),
    }
    out = {}
    for name, handle in handles.items():
        handle.pysp_em_step(estimator, start)  # warm-up; also agrees the fold plan
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(steps):
            handle.pysp_em_step(estimator, start)
        step = (time.perf_counter() - t0) / steps
        # the fold alone, every rank starting it together (a step's fold_s also waits for the slowest E-step)
        pieces, _ = handle._shard_statistics(estimator, start)
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(steps):
            handle.folding.shards(estimator, pieces, handle.layout, model=start)
        out[name] = (step, (time.perf_counter() - t0) / steps)
    # today's fold (before logical shards): the rank's one accumulator, one exchange, rank order
    handle = handles["in memory, 1 shard/rank"]
    acc = accumulate(handle.chunks, estimator, start, handle.resident.counts).accumulator
    plan, value = handle.folding.agreed.plan, acc.value()
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(steps):
        header = [0.0, 0.0] + agreement_slots(fingerprint(start), world) + [float(len(x)), 0.0]
        summed = handle.exchange.sum(np.concatenate([header, flatten_value(value)]))
        acc.from_value(plan.restore(summed[7:]))
    out["today's fold"] = (out["in memory, 1 shard/rank"][0], (time.perf_counter() - t0) / steps)
    return out


def _fold_table(n: int, world: int = 4, steps: int = 20) -> None:
    import os
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "x.npy")
        np.save(path, _problem(n)[0])
        per_rank = run_local(_fold_rank, world, n=n, steps=steps, path=path)
    print(
        f"\nfold at {world} ranks, N={n:,} K=8 (slowest rank's mean of {steps}; the fold alone, ranks "
        "starting it together, as a share of a whole step)"
    )
    print(f"{'':<26} {'step ms':>8} {'fold ms':>8} {'fold/step':>9}")
    for name in per_rank[0]:
        step = max(r[name][0] for r in per_rank) * 1e3
        fold = max(r[name][1] for r in per_rank) * 1e3
        print(f"{name:<26} {step:8.3f} {fold:8.3f} {fold / step:9.1%}")


def _hmm_problem(sequences: int):
    from mixle.stats import GaussianDistribution, HiddenMarkovModelDistribution, PoissonDistribution

    truth = HiddenMarkovModelDistribution(
        [GaussianDistribution(-3.0, 1.0), GaussianDistribution(0.0, 1.0), GaussianDistribution(3.0, 1.0)],
        [0.4, 0.3, 0.3],
        [[0.8, 0.1, 0.1], [0.1, 0.8, 0.1], [0.1, 0.1, 0.8]],
        len_dist=PoissonDistribution(20.0),
    )
    data = [list(map(float, s)) for s in truth.sampler(0).sample(sequences)]
    start = HiddenMarkovModelDistribution(
        [GaussianDistribution(-2.0, 2.0), GaussianDistribution(0.5, 2.0), GaussianDistribution(2.0, 2.0)],
        [1 / 3, 1 / 3, 1 / 3],
        [[0.6, 0.2, 0.2], [0.2, 0.6, 0.2], [0.2, 0.2, 0.6]],
        len_dist=PoissonDistribution(10.0),
    )
    return data, start


def _hmm_rank(rank, world, sequences, steps, rounds):
    import torch.distributed as dist
    from mixle.utils.parallel.torchrun import TorchRunEncodedData as MixleHandle

    from mixle_nb.parallel import TorchRunEncodedData

    data, start = _hmm_problem(sequences)
    estimator = start.estimator()
    handles = {"ours": TorchRunEncodedData(data, estimator=estimator)}
    handles["mixle"] = MixleHandle(data, estimator=estimator)
    models = {name: h.pysp_seq_estimate(estimator, start) for name, h in handles.items()}  # warm-up
    steppers = {name: (lambda model, h=h: h.pysp_seq_estimate(estimator, model)) for name, h in handles.items()}
    # mixle's own E-step and M-step on this rank's shard, no handle: the floor both handles share
    shard = data[rank::world]
    shard_encoding, shard_weights = start.dist_to_encoder().seq_encode(shard), np.ones(len(shard))

    def local_step(model):
        acc = estimator.accumulator_factory().make()
        acc.seq_update(shard_encoding, shard_weights, model)
        return estimator.estimate(None, acc.value())

    steppers["mixle E+M on the shard"] = local_step
    best = {name: float("inf") for name in steppers}
    for _ in range(rounds):  # interleaved, best round of each: the machine's noise hits all alike
        for name, step in steppers.items():
            dist.barrier()
            t0 = time.perf_counter()
            model = start
            for _ in range(steps):
                model = step(model)
            best[name] = min(best[name], (time.perf_counter() - t0) / steps)
            if name in handles:
                models[name] = model
    count, ours = handles["ours"].pysp_seq_log_density_sum(models["ours"])
    _, theirs = handles["ours"].pysp_seq_log_density_sum(models["mixle"])
    handles["ours"].close()
    return {"best": best, "observations": count, "relative_difference": abs(ours - theirs) / abs(theirs)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--big", type=int, default=1_000_000)
    parser.add_argument("--hmm-sequences", type=int, default=2_000)
    parser.add_argument("--hmm-only", action="store_true", help="skip the Gaussian-mixture table")
    parser.add_argument("--worlds", default="1,2,4", help="rank counts of the Gaussian-mixture table, e.g. 4")
    parser.add_argument("--no-hmm", action="store_true", help="skip mixle's HMM comparison (which needs mixle)")
    parser.add_argument("--fold-only", action="store_true", help="only the shard-order fold's cost at 4 ranks")
    add_json_argument(parser, "distributed_em_bench")
    args = parser.parse_args()
    tables: list[Table] = []
    if args.fold_only:
        for n in (args.big, 1_000):
            _fold_table(n)
        return
    if not args.hmm_only:
        tables.append(_gaussian_table(args.big, [int(w) for w in args.worlds.split(",")]))
    if args.no_hmm:
        write_results(args.json, "distributed_em_bench", 1, tables)
        return
    t = run_local(_hmm_rank, 2, timeout=900, sequences=args.hmm_sequences, steps=3, rounds=5)[0]
    ours, theirs, floor = (t["best"][name] for name in ("ours", "mixle", "mixle E+M on the shard"))
    print(
        f"\nmixle HMM, 3 states, {args.hmm_sequences} ragged sequences (~20 values each), 2 ranks, "
        "pysp_seq_estimate per step (best of 5 interleaved rounds of 3 steps)"
    )
    print(
        f"{'ours ms':>10}{'mixle handle ms':>17}{'ratio':>8}{'E+M alone ms':>14}"
        f"{'ours beyond it':>16}{'mixle beyond it':>17}   models agree to {t['relative_difference']:.1e}"
    )
    print(
        f"{ours * 1e3:>10.2f}{theirs * 1e3:>17.2f}{ours / theirs:>8.2f}{floor * 1e3:>14.2f}"
        f"{(ours - floor) * 1e3:>16.2f}{(theirs - floor) * 1e3:>17.2f}"
    )
    print(
        "E+M alone: mixle's own seq_update and estimate on rank 0's shard with no handle, the part of a step "
        "both handles run unchanged; a handle's step cannot be faster than it."
    )
    hmm = Table(
        f"mixle's hidden Markov model, 3 states, {args.hmm_sequences} ragged sequences, 2 ranks (ms a step)",
        ["our handle ms", "mixle's handle ms", "ours / mixle's", "E+M alone ms", "models' relative difference"],
    )
    hmm.add(ours * 1e3, theirs * 1e3, ours / theirs, floor * 1e3, t["relative_difference"])
    tables.append(hmm)
    write_results(args.json, "distributed_em_bench", 1, tables)


def _gaussian_table(big: int, worlds: list) -> Table:
    table = Table(
        "TorchRunEncodedData, one EM step (ms, K=8, D=1)",
        ["workload", "ranks", "gather ms", "all-reduce ms", "E-step ms", "raw 2-value all_reduce ms"],
    )
    print(
        f"{'workload':<18}{'ranks':>6}{'gather ms':>11}{'allreduce ms':>14}{'E-step ms':>11}{'raw 2-value all_reduce ms':>27}"
    )
    for n, steps in ((big, 5), (1_000, 200)):
        for world in worlds:
            t = run_local(_rank, world, timeout=600, n=n, steps=steps)[0]
            print(
                f"{'N=' + str(n):<18}{world:>6}{t['gather'] * 1e3:>11.2f}{t['allreduce'] * 1e3:>14.2f}"
                f"{t['allreduce_e_step'] * 1e3:>11.2f}{t['raw_all_reduce'] * 1e3:>27.3f}"
            )
            table.add(
                f"N={n}",
                world,
                t["gather"] * 1e3,
                t["allreduce"] * 1e3,
                t["allreduce_e_step"] * 1e3,
                t["raw_all_reduce"] * 1e3,
            )
    return table


if __name__ == "__main__":
    main()
