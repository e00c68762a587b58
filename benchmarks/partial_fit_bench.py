"""``GaussianMixture.partial_fit`` over chunks of a ``.npy``, in one process and on 2 ranks,
beside one full EM iteration over the same file (issue 38's speed bullet).

Writes ``--n`` rows (``--d`` features, ``--k`` overlapping Gaussian clusters, float64) to a
``.npy`` in ``--tmp`` (deleted afterwards), then, each in processes of its own so that each
one's peak resident memory is its own:

1. partial_fit, one process: ``--passes`` passes over ``--chunks`` row blocks, each block
   copied out of an ``np.load(mmap_mode="r")`` opened and closed for it (one block in memory at
   a time: a memmap kept open over the file would keep every page it read resident);
2. partial_fit, 2 ranks (``run_local``, gloo): every rank copies ITS rows of each block
   (``block[rank::2]``) out of its own memmap and folds them through a
   ``TorchRunEncodedData.from_shards`` handle, so no process holds more than its part of a block;
3. one full EM iteration, one process: a ``TorchRunEncodedData.from_npy`` handle over the
   whole file (one rank, the memmap read part by part and encoded in memory), started from
   the one-process partial_fit model; the best of ``--em-steps`` steps after a warm-up.

Prints and records (``benchmarks/results/partial_fit_bench.json``) the rows per second of one
pass (reading included; the fastest pass) or one EM iteration, each process's peak resident
memory (and its resident memory before it read any row: the interpreter, numpy and torch),
the chunk's size, and the mean log-likelihood per row of every model over all the data.
With ``--gap``, also fits the batch model to ``tol=1e-6`` in memory and prints the gap between
its mean log-likelihood and partial_fit's (below 1e-3 after 3 passes of 40 chunks at the
defaults N = 2e5, D = 4, K = 5); that needs the whole array in memory.

Usage: OMP_NUM_THREADS=1 .venv/bin/python benchmarks/partial_fit_bench.py [--n 200000] [--d 4] [--k 5]
[--chunks 40] [--passes 3] [--em-steps 2] [--gap] [--tmp /tmp]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
import warnings

import numpy as np
from results import Table, add_json_argument, write_results

from mixle_nb.mixture import GaussianMixture
from mixle_nb.parallel.local_launch import run_local

WRITE_BLOCK = 250_000  # rows generated and written at a time, so writing holds one block too


def write_data(path: str, n: int, d: int, k: int) -> None:
    """``n`` rows of ``k`` overlapping clusters to a float64 ``.npy``, written block by block."""
    rng = np.random.default_rng(0)
    centres = rng.normal(size=(k, d)) * 3
    with open(path, "wb") as f:
        np.lib.format.write_array_header_2_0(f, {"descr": "<f8", "fortran_order": False, "shape": (n, d)})
        for start in range(0, n, WRITE_BLOCK):
            stop = min(n, start + WRITE_BLOCK)
            f.write((centres[rng.integers(k, size=stop - start)] + rng.normal(size=(stop - start, d))).tobytes())


def peak_mib() -> float:
    """This process's peak resident memory, MiB: ``VmHWM``, which starts afresh at ``exec``
    (``getrusage``'s ``ru_maxrss`` keeps the peak of the parent a spawned child was forked from)."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmHWM in /proc/self/status (Linux only)")


def resident_mib() -> float:
    """This process's resident memory now, MiB."""
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def block_bounds(n: int, chunks: int) -> list[tuple[int, int]]:
    """The ``chunks`` row blocks ``[start, stop)`` of ``n`` rows."""
    bounds = np.linspace(0, n, chunks + 1).astype(int)
    return list(zip(bounds[:-1].tolist(), bounds[1:].tolist()))


def read_block(path: str, start: int, stop: int, step: int = 1) -> np.ndarray:
    """Rows ``start:stop:step`` of the ``.npy``, copied out of a memmap opened for them alone.

    The memmap is closed again, so that the file's pages it touched leave this process's
    resident memory (a memmap held open over the whole file keeps every page it has read).
    """
    rows = np.load(path, mmap_mode="r")
    block = np.array(rows[start:stop:step])
    del rows
    return block


def fitted(gm: GaussianMixture) -> dict:
    """The parameters to rebuild ``gm``'s model from."""
    return {"means": gm.means_, "weights": gm.weights_, "covariances": gm.covariances_}


def one_process(rank: int, world: int, path: str, k: int, chunks: int, passes: int) -> dict:
    """partial_fit over the memmap's blocks, each copied out alone: seconds a pass, peak memory."""
    warnings.simplefilter("ignore")
    before = resident_mib()
    n = len(np.load(path, mmap_mode="r"))
    gm = GaussianMixture(k, random_state=0)
    seconds = []
    for _ in range(passes):
        begun = time.perf_counter()
        for start, stop in block_bounds(n, chunks):
            gm.partial_fit(read_block(path, start, stop))
        seconds.append(time.perf_counter() - begun)
    return {"seconds": seconds, "before": before, "peak": peak_mib(), **fitted(gm)}


def on_ranks(rank: int, world: int, path: str, k: int, chunks: int, passes: int) -> dict:
    """partial_fit on every rank, each reading its rows of each block from its own memmap."""
    from mixle_nb.parallel import TorchRunEncodedData

    warnings.simplefilter("ignore")
    before = resident_mib()
    n, d = np.load(path, mmap_mode="r").shape
    gm = GaussianMixture(k, random_state=0)
    estimator = gm.mixture_estimator(d)
    seconds = []
    for _ in range(passes):
        begun = time.perf_counter()
        for start, stop in block_bounds(n, chunks):
            mine = read_block(path, start + rank, stop, world)
            with TorchRunEncodedData.from_shards(mine, estimator=estimator) as handle:
                gm.partial_fit(handle)
        seconds.append(time.perf_counter() - begun)
    return {"seconds": seconds, "before": before, "peak": peak_mib(), **fitted(gm)}


def em_iteration(rank: int, world: int, path: str, k: int, model: dict, steps: int) -> dict:
    """Seconds of one EM iteration on a ``from_npy`` handle over the whole file (best of ``steps``)."""
    from mixle_nb.mixture.translation import model_from_parameters
    from mixle_nb.parallel import TorchRunEncodedData

    before = resident_mib()
    estimator = GaussianMixture(k).mixture_estimator(model["means"].shape[1])
    start = model_from_parameters("full", model["weights"], model["means"], model["covariances"])
    with TorchRunEncodedData.from_npy(path, estimator) as handle:
        handle.pysp_em_step(estimator, start)  # warm-up
        seconds = []
        for _ in range(steps):
            begun = time.perf_counter()
            handle.pysp_em_step(estimator, start)
            seconds.append(time.perf_counter() - begun)
    return {"seconds": seconds, "before": before, "peak": peak_mib()}


def mean_log_likelihood(path: str, k: int, model: dict, chunks: int) -> float:
    """The mean log-likelihood per row of ``model`` over the file, block by block."""
    n = len(np.load(path, mmap_mode="r"))
    gm = GaussianMixture(
        k, max_iter=0, means_init=model["means"], weights_init=model["weights"], precisions_init=precisions(model)
    )
    gm.fit(read_block(path, 0, max(k, n // chunks)))  # max_iter=0: the model as given
    total = sum(gm.score(read_block(path, start, stop)) * (stop - start) for start, stop in block_bounds(n, chunks))
    return total / n


def precisions(model: dict) -> np.ndarray:
    """The precision matrices of full covariances."""
    return np.linalg.inv(model["covariances"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=200_000)
    parser.add_argument("--d", type=int, default=4)
    parser.add_argument("--k", type=int, default=5)
    parser.add_argument("--chunks", type=int, default=40)
    parser.add_argument("--passes", type=int, default=3)
    parser.add_argument("--em-steps", type=int, default=2, help="timed EM iterations after a warm-up")
    parser.add_argument("--gap", action="store_true", help="also fit the batch model in memory and print the gap")
    parser.add_argument("--tmp", default=tempfile.gettempdir(), help="where the .npy is written (deleted after)")
    add_json_argument(parser, "partial_fit_bench")
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    kwargs = dict(k=args.k, chunks=args.chunks, passes=args.passes)
    with tempfile.TemporaryDirectory(dir=args.tmp) as tmp:
        path = os.path.join(tmp, "rows.npy")
        write_data(path, args.n, args.d, args.k)
        single = run_local(one_process, 1, timeout=3600, path=path, **kwargs)[0]
        ranks = run_local(on_ranks, 2, timeout=3600, path=path, **kwargs)
        em = run_local(em_iteration, 1, timeout=3600, path=path, k=args.k, model=single, steps=args.em_steps)[0]
        scores = {
            "single": mean_log_likelihood(path, args.k, single, args.chunks),
            "ranks": mean_log_likelihood(path, args.k, ranks[0], args.chunks),
        }
        batch_ll = batch_gap(path, args.k) if args.gap else None
    chunk_mib = args.n / args.chunks * args.d * 8 / 2**20
    table = Table(
        f"partial_fit against one EM iteration, N = {args.n:,}, D = {args.d}, K = {args.k}, "
        f"{args.chunks} chunks of {chunk_mib:.1f} MiB, {args.passes} passes (fastest pass; one thread a process)",
        ["run", "processes", "rows/s", "resident MiB before reading", "peak MiB per process", "mean log-likelihood"],
    )
    table.add(
        "partial_fit, one pass", 1, args.n / min(single["seconds"]), single["before"], single["peak"], scores["single"]
    )
    table.add(
        "partial_fit, one pass",
        2,
        args.n / min(max(r["seconds"][p] for r in ranks) for p in range(args.passes)),
        max(r["before"] for r in ranks),
        max(r["peak"] for r in ranks),
        scores["ranks"],
    )
    table.add("fit, one EM iteration", 1, args.n / min(em["seconds"]), em["before"], em["peak"], scores["single"])
    print(table.title)
    print(f"{'':28s}{'processes':>10s}{'rows/s':>12s}{'MiB before':>11s}{'peak MiB':>10s}{'mean log-lik':>14s}")
    for name, processes, rate, before, peak, ll in table.rows:
        print(f"{name:28s}{processes:10d}{rate:12.3g}{before:11.0f}{peak:10.0f}{ll:14.6f}")
    print(
        "the EM iteration's mean log-likelihood is that of its start (the one-process partial_fit model); "
        f"the file is {args.n * args.d * 8 / 2**20:.0f} MiB"
    )
    if batch_ll is not None:
        print(
            f"batch fit: mean log-likelihood {batch_ll:.6f}; gap (batch - partial_fit): {batch_ll - scores['single']:.2e}"
        )
    write_results(args.json, "partial_fit_bench", 1, [table])


def batch_gap(path: str, k: int) -> float:
    """The batch fit's mean log-likelihood per row (to ``tol=1e-6``, the whole array in memory)."""
    x = np.load(path)
    return GaussianMixture(k, random_state=0, tol=1e-6, max_iter=500).fit(x).score(x)


if __name__ == "__main__":
    main()
