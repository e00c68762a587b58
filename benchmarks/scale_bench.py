"""Data that never passes through the notebook: TorchRunEncodedData.from_npy at scale.

N 1-D observations (default 1e8: an 800 MB .npy written block by block into a temporary
directory, deleted afterwards), a K=8 Gaussian mixture, 2 ranks that each read their own rows.
Reported side by side:

- the notebook process's peak RSS (this process: it writes the file and launches the ranks,
  never holding the data; target under 300 MB);
- each rank's peak RSS against its encoded shard (target within 1.2x), and the RSS the rank
  had before building (interpreter, torch), so the shard's own overhead can be read;
- handle build time, and the per-step time per observation against N = 1e6 from the same
  kind of file (target: flat within 1.3x);
- the same data pushed from the notebook (passed whole to every rank, as ``%mixle_push``
  does) at ``--push-n`` observations, for comparison.

Run: .venv/bin/python benchmarks/scale_bench.py [--n 100000000] [--push-n N] [--steps 3]
"""

from __future__ import annotations

import argparse
import os
import resource
import tempfile
import time

import numpy as np

from mixle_nb.parallel.local_launch import run_local

K = 8
BLOCK = 1 << 20  # observations generated (and written) at a time


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # Linux reports KiB


def _current_rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _draw(rng: np.random.Generator, n: int) -> np.ndarray:
    means = np.linspace(-8, 8, K)
    return means[rng.integers(K, size=n)] + rng.standard_normal(n)


def draw_all(n: int, seed: int = 0) -> np.ndarray:
    """The same draws as :func:`write_npy`, in memory (what a notebook would push)."""
    rng, x = np.random.default_rng(seed), np.empty(n)
    for start in range(0, n, BLOCK):
        x[start : start + BLOCK] = _draw(rng, min(BLOCK, n - start))
    return x


def write_npy(path: str, n: int, seed: int = 0) -> None:
    """Write ``n`` draws as a float64 .npy, block by block: this process never holds them."""
    rng = np.random.default_rng(seed)
    with open(path, "wb") as f:
        np.lib.format.write_array_header_2_0(f, {"descr": "<f8", "fortran_order": False, "shape": (n,)})
        for start in range(0, n, BLOCK):
            _draw(rng, min(BLOCK, n - start)).tofile(f)


def _start():
    from mixle_nb.stats import GaussianDistribution, MixtureDistribution

    return MixtureDistribution([GaussianDistribution(m + 0.3, 1.0) for m in np.linspace(-8, 8, K)], np.full(K, 1 / K))


def _encoded_bytes(chunks) -> int:
    """Bytes of the arrays and tensors an encoding holds (our MomentEncoding: features)."""
    import torch

    total = 0
    for enc in chunks:
        for value in vars(enc).values():
            if isinstance(value, torch.Tensor):
                total += value.element_size() * value.nelement()
            elif isinstance(value, np.ndarray):
                total += value.nbytes
    return total


def _rank(rank, world, path, data, steps, sub_chunks):
    import torch.distributed as dist

    from mixle_nb.parallel import TorchRunEncodedData

    start = _start()
    estimator = start.estimator()
    before = _current_rss_mb()
    dist.init_process_group("gloo")
    dist.barrier()
    t0 = time.perf_counter()
    if path is not None:
        handle = TorchRunEncodedData.from_npy(path, estimator=estimator, sub_chunks=sub_chunks)
    else:
        handle = TorchRunEncodedData(data, estimator=estimator, sub_chunks=sub_chunks)
        del data
    build_s = time.perf_counter() - t0
    handle.pysp_em_step(estimator, start)  # warm-up
    dist.barrier()
    t0 = time.perf_counter()
    model = start
    for _ in range(steps):
        model = handle.pysp_em_step(estimator, model).model
    step_s = (time.perf_counter() - t0) / steps
    result = {
        "shard": handle.local_count,
        "encoded_mb": _encoded_bytes(handle.chunks) / 2**20,
        "rss_before_mb": before,
        "peak_rss_mb": _peak_rss_mb(),
        "build_s": build_s,
        "step_s": step_s,
        "count": len(handle),
    }
    handle.close()
    dist.destroy_process_group()
    return result


def _row(label: str, results: list, notebook_mb: float) -> None:
    r0 = results[0]

    def per_rank(values, spec):
        return " / ".join(format(v, spec) for v in values)

    peaks = per_rank([r["peak_rss_mb"] for r in results], ".0f")
    encoded = per_rank([r["encoded_mb"] for r in results], ".0f")
    ratios = per_rank([r["peak_rss_mb"] / r["encoded_mb"] for r in results], ".2f")
    own = per_rank([(r["peak_rss_mb"] - r["rss_before_mb"]) / r["encoded_mb"] for r in results], ".2f")
    per_obs_ns = r0["step_s"] / r0["count"] * 1e9
    print(
        f"{label:<22}{r0['count']:>10.3g}{notebook_mb:>13.0f}{peaks:>17}{encoded:>15}{ratios:>16}{own:>17}"
        f"{max(r['build_s'] for r in results):>9.1f}{r0['step_s']:>9.2f}{per_obs_ns:>9.1f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=100_000_000)
    parser.add_argument("--small-n", type=int, default=1_000_000)
    parser.add_argument("--push-n", type=int, default=None, help="pushed comparison size (default: --n; 0: skip)")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--sub-chunks", type=int, default=64)
    args = parser.parse_args()
    push_n = args.n if args.push_n is None else args.push_n
    print(f"K={K} Gaussian mixture, 2 ranks, sub_chunks={args.sub_chunks}; rank columns read 'rank 0 / rank 1'")
    print(
        f"{'source':<22}{'N':>10}{'notebook MB':>13}{'rank peak MB':>17}{'encoded MB':>15}"
        f"{'peak/enc':>16}{'(peak-base)/enc':>17}{'build s':>9}{'step s':>9}{'ns/obs':>9}"
    )
    per_obs = {}
    with tempfile.TemporaryDirectory() as tmp:
        for n in (args.small_n, args.n):
            path = os.path.join(tmp, f"x{n}.npy")
            write_npy(path, n)
            results = run_local(
                _rank, 2, timeout=3600, path=path, data=None, steps=args.steps, sub_chunks=args.sub_chunks
            )
            os.remove(path)
            per_obs[n] = results[0]["step_s"] / results[0]["count"]
            _row("from_npy", results, _peak_rss_mb())
    notebook_before_push = _peak_rss_mb()
    print(f"\nnotebook peak RSS before any push: {notebook_before_push:.0f} MB (target < 300)")
    print(
        f"per-observation step cost, N={args.n:.3g} vs N={args.small_n:.3g}: "
        f"{per_obs[args.n] / per_obs[args.small_n]:.2f}x (target within 1.3x)"
    )
    if push_n == 0:
        return
    x = draw_all(push_n)
    results = run_local(_rank, 2, timeout=3600, path=None, data=x, steps=args.steps, sub_chunks=args.sub_chunks)
    del x
    _row("pushed from notebook", results, _peak_rss_mb())


if __name__ == "__main__":
    main()
