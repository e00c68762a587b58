"""What training checkpoints cost, side by side in one run (CPU, gloo on loopback, 2 ranks).

The LM configuration of streaming_bench.py (60,000 tokens of the 64-symbol Markov chain,
d_model 64, 2 layers, block 32, batch 64 windows a rank, AdamW 3e-3), ``--steps`` optimizer
steps a round, in three modes interleaved round by round in the same two processes: no
checkpoints, ``dcp.async_save`` every 50 steps, and ``dcp.save`` (synchronous) every 50 steps.
Prints each round's training seconds, the overhead of each mode against no checkpoints (median
over rounds), the seconds training spent blocked in the checkpoint calls (the copy at the step,
waiting for the save before, the end of the call waiting for the last), which the machine's
noise does not blur, and what one checkpoint holds on disk. The target: async at most 5%.

Usage: OMP_NUM_THREADS=1 .venv/bin/python benchmarks/checkpoint_bench.py [--rounds 5] [--steps 150]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

from results import Table, add_json_argument, write_results
from streaming_bench import BATCH, BLOCK, D_MODEL, LR, N_HEAD, N_LAYER, VOCAB, chain_tokens

from mixle_nb.checkpoint.training import TrainingCheckpoints
from mixle_nb.neural import StreamingTransformerLeafEstimator, build_causal_lm
from mixle_nb.parallel import StreamingTokenEncodedData
from mixle_nb.parallel.local_launch import run_local

EVERY = 50
MODES = {"none": None, "async every 50": True, "sync every 50": False}
_blocked = [0.0]  # seconds spent in TrainingCheckpoints.save / wait, this process


def _timed(method):
    def timed(self, *args):
        start = time.perf_counter()
        try:
            return method(self, *args)
        finally:
            _blocked[0] += time.perf_counter() - start

    return timed


TrainingCheckpoints.save = _timed(TrainingCheckpoints.save)
TrainingCheckpoints.wait = _timed(TrainingCheckpoints.wait)


def _train_seconds(tokens, steps: int, root, asynchronous) -> float:
    estimator = StreamingTransformerLeafEstimator(
        build_causal_lm(VOCAB, D_MODEL, N_LAYER, N_HEAD, BLOCK, seed=0), lr=LR
    )
    options = {} if root is None else {"checkpoint": root, "checkpoint_every": EVERY, "checkpoint_async": asynchronous}
    handle = StreamingTokenEncodedData(tokens, block=BLOCK, batch_size=BATCH, epochs=1000, max_steps=steps, **options)
    _blocked[0] = 0.0
    start = time.perf_counter()
    handle.pysp_seq_estimate(estimator, None)  # returns once the last save is complete
    return time.perf_counter() - start, _blocked[0]


def _rounds(rank: int, world: int, rounds: int, steps: int, root: str) -> dict:
    import torch.distributed as dist

    dist.init_process_group("gloo")  # one group for every round: the handles adopt it
    tokens, _, _ = chain_tokens()
    _train_seconds(tokens, 10, None, None)  # warm-up
    times: dict = {mode: [] for mode in MODES}
    for r in range(rounds):
        for mode, asynchronous in MODES.items():
            path = None if asynchronous is None else os.path.join(root, f"{mode.split()[0]}-{r}")
            times[mode].append(_train_seconds(tokens, steps, path, asynchronous))
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=150)
    add_json_argument(parser, "checkpoint_bench")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as root:
        times = run_local(_rounds, 2, timeout=3600, rounds=args.rounds, steps=args.steps, root=root)[0]
        run = os.path.join(root, "async-0")
        one = os.path.join(run, sorted(os.listdir(run))[-1])  # the newest (older ones are pruned)
        size = sum(os.path.getsize(os.path.join(one, f)) for f in os.listdir(one))
    print(
        f"{args.steps} steps a round, 2 ranks, checkpoint every {EVERY} steps "
        f"({args.steps // EVERY} saves a round, {size / 1e6:.2f} MB each)"
    )
    for r in range(args.rounds):
        print(f"round {r + 1}: " + ", ".join(f"{m} {times[m][r][0]:.2f} s" for m in MODES))
    table = Table(
        f"Training with checkpoints, 2 ranks, {args.steps} steps a round, one every {EVERY} steps "
        f"({size / 1e6:.2f} MB), {args.rounds} interleaved rounds",
        [
            "mode",
            "wall time / none (median)",
            "fastest round",
            "slowest round",
            "blocked in checkpoint calls",
            "blocked s a round",
        ],
    )
    for mode in list(MODES)[1:]:
        ratios = [t / n for (t, _), (n, _) in zip(times[mode], times["none"])]
        blocked = [b / t for t, b in times[mode]]
        print(
            f"{mode}: overhead {100 * (statistics.median(ratios) - 1):+.1f}% (median), by round "
            f"{100 * (min(ratios) - 1):+.1f}% to {100 * (max(ratios) - 1):+.1f}%; training blocked in the "
            f"checkpoint calls {100 * statistics.median(blocked):.1f}% of its time (median; "
            f"{statistics.median(b for _, b in times[mode]):.3f} s a round)"
        )
        table.add(
            mode,
            statistics.median(ratios),
            min(ratios),
            max(ratios),
            statistics.median(blocked),
            statistics.median(b for _, b in times[mode]),
        )
    write_results(args.json, "checkpoint_bench", 1, [table])


if __name__ == "__main__":
    main()
