"""Streaming-training benchmark, side by side in one run (CPU, gloo on loopback).

1. training tokens/s at 1 and 2 ranks (a token = one next-token target);
2. window building: ``stream_token_source`` against a naive per-window ``np.stack`` source;
3. training tokens/s with and without the progress callback.

Usage: OMP_NUM_THREADS=1 .venv/bin/python benchmarks/streaming_bench.py [--steps 60]
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np
import torch

from mixle_nb.neural import StreamingTransformerLeafEstimator, build_causal_lm, stream_token_source
from mixle_nb.parallel import StreamingTokenEncodedData
from mixle_nb.parallel.local_launch import run_local

VOCAB, BLOCK, BATCH = 64, 32, 32
MODEL = dict(d_model=64, n_layer=2, n_head=4, block=BLOCK)


def tokens(n: int) -> np.ndarray:
    return np.random.default_rng(0).integers(0, VOCAB, n).astype(np.uint8)


def train_tokens_per_s(steps: int, progress=None, n_tokens: int = 200_000) -> float:
    """Tokens/s of this process over ``steps`` optimizer steps, after 5 warm-up steps."""
    h = StreamingTokenEncodedData(tokens(n_tokens), block=BLOCK, batch_size=BATCH, progress=progress,
                                  max_steps=5)
    est = StreamingTransformerLeafEstimator(build_causal_lm(VOCAB, **MODEL))
    h.pysp_seq_estimate(est, None)
    h.max_steps = steps
    start = time.perf_counter()
    h.pysp_seq_estimate(est, None)
    elapsed = time.perf_counter() - start
    h.close()
    return steps * BATCH / elapsed


def _rank(rank: int, world: int, steps: int) -> float:
    return train_tokens_per_s(steps)  # the handle inits the group from the env and owns it


def two_rank_tokens_per_s(steps: int) -> float:
    return sum(run_local(_rank, 2, timeout=300, steps=steps))


def naive_source(token_ids, block, batch_size, seed=0):
    """The reference's shape: a materialised permutation and one Python slice per window."""
    order = np.random.default_rng(seed).permutation(len(token_ids) - block)
    for lo in range(0, len(order), batch_size):
        idx = order[lo:lo + batch_size]
        yield np.stack([token_ids[i:i + block] for i in idx]), token_ids[idx + block]


def windows_per_s(source, n_batches: int) -> float:
    """Steady-state rate: the first batch (the naive source's permutation) is not timed."""
    next(source)
    start = time.perf_counter()
    count = sum(len(nxt) for _, (_, nxt) in zip(range(n_batches), source))
    return count / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60, help="optimizer steps per timing")
    parser.add_argument("--repeats", type=int, default=5, help="timings per median")
    args = parser.parse_args()
    torch.set_num_threads(1)

    one = train_tokens_per_s(args.steps)
    two = two_rank_tokens_per_s(args.steps)
    print(f"training  model={MODEL} batch={BATCH}/rank, {os.cpu_count()} CPU cores")
    print(f"  1 rank : {one:10.0f} tokens/s")
    print(f"  2 ranks: {two:10.0f} tokens/s (sum over ranks; x{two / one:.2f})")

    ids = tokens(2_000_000)
    block, batch, n_batches = 64, 256, 400
    fast = statistics.median(windows_per_s(stream_token_source(ids, block, batch, seed=s), n_batches)
                             for s in range(args.repeats))
    naive = statistics.median(windows_per_s(naive_source(ids, block, batch, seed=s), n_batches)
                              for s in range(args.repeats))
    print(f"windows   block={block} batch={batch} over {len(ids):,} tokens, median of {args.repeats}")
    print(f"  stream_token_source: {fast:12.0f} windows/s")
    print(f"  naive np.stack     : {naive:12.0f} windows/s  (speed-up x{fast / naive:.1f})")

    reports = []
    off, on = [], []
    for _ in range(args.repeats):  # alternate so drift in machine load hits both alike
        off.append(train_tokens_per_s(args.steps))
        on.append(train_tokens_per_s(args.steps, progress=reports.append))
    off_m, on_m = statistics.median(off), statistics.median(on)
    print(f"progress  callback every 10 steps, median of {args.repeats}")
    print(f"  without: {off_m:10.0f} tokens/s")
    print(f"  with   : {on_m:10.0f} tokens/s  (cost {100 * (off_m - on_m) / off_m:+.2f}%)")


if __name__ == "__main__":
    main()
