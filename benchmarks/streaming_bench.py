"""Streaming-training benchmark, side by side in one run (CPU, gloo on loopback, 2 ranks).

1. Every-position training against one target per window (issue 18), on a 64-symbol Markov
   chain of known entropy rate: 60,000 training tokens, d_model 64, 2 layers, 2 heads, block 32,
   batch 64 windows a rank, AdamW lr 3e-3. Contenders: our handle with our CausalLM, our handle
   with mixle's CausalLM, and mixle's own ``StreamingTokenEncodedData`` (when mixle is
   installed). Each trains epoch after epoch until the held-out NLL is within 5% of the entropy
   rate or ``--budget`` seconds of training have passed, and reports the held-out NLL after
   one epoch, the wall time of an epoch, targets/s (tokens whose loss was taken, both ranks),
   and the training wall time until within 5%.
2. Window building: ``stream_sequence_source`` against a naive per-window ``np.stack`` source.
3. Training targets/s with and without the progress callback.

Every contender's epoch predicts each training token about once: ours as ``block`` targets
from each of ``len // block`` windows, mixle's as one target from each of ``len - block``.

Usage: OMP_NUM_THREADS=1 .venv/bin/python benchmarks/streaming_bench.py [--budget 90]
"""
from __future__ import annotations

import argparse
import statistics
import time
from datetime import timedelta

import numpy as np
import torch
import torch.distributed as dist

from mixle_nb.neural import (StreamingTransformerLeaf, StreamingTransformerLeafEstimator,
                             build_causal_lm, stream_sequence_source)
from mixle_nb.neural.source import gather_windows, window_view
from mixle_nb.parallel import StreamingTokenEncodedData
from mixle_nb.parallel.local_launch import run_local

VOCAB, D_MODEL, N_LAYER, N_HEAD, BLOCK, BATCH, LR = 64, 64, 2, 2, 32, 64, 3e-3
N_TRAIN, N_HELD_OUT, WITHIN = 60_000, 10_000, 1.05


def markov_chain(n: int, seed: int) -> tuple[np.ndarray, float]:
    """``n`` tokens of a fixed 64-state chain (Dirichlet(0.1) rows) and its entropy rate (nats)."""
    trans = np.random.default_rng(5).dirichlet(np.full(VOCAB, 0.1), VOCAB)
    evals, evecs = np.linalg.eig(trans.T)
    pi = np.real(evecs[:, np.argmin(abs(evals - 1))])
    pi /= pi.sum()
    logs = np.log(np.where(trans > 0, trans, 1.0))
    entropy_rate = -float(np.sum(pi[:, None] * trans * logs))
    cdf, u = trans.cumsum(1), np.random.default_rng(seed).random(n)
    out = np.empty(n, dtype=np.int64)
    out[0] = 0
    for i in range(1, n):
        out[i] = min(np.searchsorted(cdf[out[i - 1]], u[i]), VOCAB - 1)
    return out, entropy_rate


def held_out_nll(module, tokens: np.ndarray) -> float:
    """Mean next-token NLL of every held-out token after the first ``BLOCK``, each with a full
    ``BLOCK`` of context: the same scorer (our leaf on the module) for every contender."""
    leaf = StreamingTransformerLeaf(module)
    windows = window_view(tokens, BLOCK)
    starts = np.arange(len(tokens) - BLOCK)
    return -float(np.mean(np.concatenate([leaf.seq_log_density(gather_windows(windows, chunk))
                                          for chunk in np.array_split(starts, 8)])))


def _contender(name: str):
    """``(handle class, estimator)`` of a contender, built alike on every rank."""
    if name == "ours":
        module = build_causal_lm(VOCAB, D_MODEL, N_LAYER, N_HEAD, BLOCK, seed=0)
        return StreamingTokenEncodedData, StreamingTransformerLeafEstimator(module, lr=LR)
    from mixle.models.streaming_transformer_leaf import StreamingTransformerEstimator
    from mixle.models.transformer import build_causal_lm as mixle_causal_lm

    torch.manual_seed(0)
    est = StreamingTransformerEstimator(mixle_causal_lm(VOCAB, D_MODEL, N_LAYER, N_HEAD, BLOCK), lr=LR)
    if name == "ours, mixle's model":
        return StreamingTokenEncodedData, est
    from mixle.utils.parallel.torch_neural import StreamingTokenEncodedData as MixleHandle

    return MixleHandle, est


def _race(rank: int, world: int, name: str, budget: float) -> dict:
    """Train ``name`` epoch by epoch on this rank's shard; time training only (not scoring)."""
    train, entropy_rate = markov_chain(N_TRAIN, seed=1)
    held_out, _ = markov_chain(N_HELD_OUT, seed=2)
    dist.init_process_group("gloo", timeout=timedelta(seconds=120))
    try:
        handle_class, est = _contender(name)
        h = handle_class(train, block=BLOCK, batch_size=BATCH, epochs=1)
        epochs, trained, reached = [], 0.0, None
        while trained < budget and reached is None:
            dist.barrier()  # start the clock together: scoring on the ranks may end apart
            start = time.perf_counter()
            leaf = h.pysp_seq_estimate(est, None)
            dist.barrier()
            seconds = time.perf_counter() - start
            trained += seconds
            nll = held_out_nll(leaf.module, held_out)
            epochs.append((seconds, nll))
            if nll <= WITHIN * entropy_rate:
                reached = trained
        h.close()
        targets = h.total_steps * BATCH * BLOCK if handle_class is StreamingTokenEncodedData \
            else sum(h._window_counts)  # mixle: one target per window, every window of every shard
        if handle_class is StreamingTokenEncodedData:
            targets *= world
        return {"epochs": epochs, "reached": reached, "targets_per_epoch": targets,
                "entropy_rate": entropy_rate}
    finally:
        dist.destroy_process_group()


def compare(budget: float) -> None:
    names = ["ours", "ours, mixle's model", "mixle's handle"]
    try:
        import mixle  # noqa: F401
    except ImportError:
        names = names[:1]
        print("mixle is not installed: only our handle runs")
    results = {name: run_local(_race, 2, timeout=budget + 300, name=name, budget=budget)[0]
               for name in names}
    rate = results[names[0]]["entropy_rate"]
    print(f"every position vs one target per window: {N_TRAIN:,} tokens of a {VOCAB}-symbol Markov "
          f"chain (entropy rate {rate:.3f} nats), d_model {D_MODEL}, {N_LAYER} layers, {N_HEAD} heads, "
          f"block {BLOCK}, batch {BATCH}/rank, AdamW lr {LR}, 2 ranks; training time only")
    print(f"  {'contender':22s} {'NLL after 1 epoch':>18s} {'s/epoch':>8s} {'targets/epoch':>14s} "
          f"{'targets/s':>10s} {'s to within 5%':>15s}")
    rows = {}
    for name, res in results.items():
        epochs = res["epochs"]
        per_epoch = statistics.median(s for s, _ in epochs)
        per_s = res["targets_per_epoch"] / per_epoch
        rows[name] = (per_epoch, per_s)
        nll = epochs[0][1]
        reached = (f"{res['reached']:.1f} ({len(epochs)} ep)" if res["reached"] is not None
                   else f"> {sum(s for s, _ in epochs):.0f} (best {min(n for _, n in epochs) / rate:.3f}x)")
        print(f"  {name:22s} {nll:8.3f} ({nll / rate:5.3f}x) {per_epoch:8.2f} "
              f"{res['targets_per_epoch']:14,d} {per_s:10,.0f} {reached:>15s}")
    if "mixle's handle" in rows:
        (ours_s, ours_rate), (mixle_s, mixle_rate) = rows["ours"], rows["mixle's handle"]
        print(f"  ours / mixle: epoch time x{ours_s / mixle_s:.3f}, targets/s x{ours_rate / mixle_rate:.1f}")


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


def train_targets_per_s(steps: int, progress=None) -> float:
    """Targets/s of one process over ``steps`` optimizer steps, after 5 warm-up steps."""
    ids = np.random.default_rng(0).integers(0, VOCAB, 200_000)
    h = StreamingTokenEncodedData(ids, block=BLOCK, batch_size=BATCH, progress=progress, max_steps=5,
                                  init_process_group=False)
    est = StreamingTransformerLeafEstimator(build_causal_lm(VOCAB, D_MODEL, N_LAYER, N_HEAD, BLOCK))
    h.pysp_seq_estimate(est, None)
    h.max_steps = steps
    start = time.perf_counter()
    h.pysp_seq_estimate(est, None)
    return steps * BATCH * BLOCK / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", type=float, default=90.0,
                        help="training seconds per contender before giving up on the 5%% mark")
    parser.add_argument("--steps", type=int, default=30, help="optimizer steps per progress timing")
    parser.add_argument("--repeats", type=int, default=5, help="timings per median")
    args = parser.parse_args()
    torch.set_num_threads(1)
    compare(args.budget)

    ids = np.random.default_rng(0).integers(0, VOCAB, 2_000_000)
    n_batches = 400
    fast = statistics.median(windows_per_s(stream_sequence_source(ids, BLOCK, BATCH, seed=s), n_batches)
                             for s in range(args.repeats))
    naive = statistics.median(windows_per_s(naive_source(ids, BLOCK, BATCH, seed=s), n_batches)
                              for s in range(args.repeats))
    print(f"windows   block={BLOCK} batch={BATCH} over {len(ids):,} tokens, median of {args.repeats}")
    print(f"  stream_sequence_source: {fast:12.0f} windows/s ({fast * BLOCK:,.0f} targets/s)")
    print(f"  naive np.stack        : {naive:12.0f} windows/s (one target each; windows x{fast / naive:.1f})")

    reports, off, on = [], [], []
    for _ in range(args.repeats):  # alternate so drift in machine load hits both alike
        off.append(train_targets_per_s(args.steps))
        on.append(train_targets_per_s(args.steps, progress=reports.append))
    off_m, on_m = statistics.median(off), statistics.median(on)
    print(f"progress  callback every 10 steps, 1 process, median of {args.repeats}")
    print(f"  without: {off_m:10.0f} targets/s")
    print(f"  with   : {on_m:10.0f} targets/s  (cost {100 * (off_m - on_m) / off_m:+.2f}%)")


if __name__ == "__main__":
    main()
