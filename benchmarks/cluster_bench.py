"""MixleCluster against plain ipyparallel, side by side in one run.

    .venv/bin/python benchmarks/cluster_bench.py [--sizes 2 4] [--calls 200]

Start: time from start() until the torch.distributed group is ready, against
``ipyparallel.Cluster(n=n).start_and_connect_sync()`` (engines registered, no torch).
Round trip: a no-op on every rank, ``MixleCluster.run`` against ``DirectView.apply_sync``,
interleaved on the same engines so both see the same machine load.
"""
import argparse
import statistics
import time

import ipyparallel as ipp

from mixle_nb.cluster import MixleCluster


def noop():
    return None


def time_plain_start(n):
    t0 = time.perf_counter()
    cluster = ipp.Cluster(n=n, log_level=30)
    client = cluster.start_and_connect_sync()
    elapsed = time.perf_counter() - t0
    client.close()
    cluster.stop_cluster_sync()
    return elapsed


def time_mixle(n, calls):
    t0 = time.perf_counter()
    cluster = MixleCluster(n).start()
    start_s = time.perf_counter() - t0
    try:
        view = cluster.view
        for _ in range(20):  # warm both paths
            cluster.run(noop)
            view.apply_sync(noop)
        plain, mixle = [], []
        for _ in range(calls):
            t = time.perf_counter()
            view.apply_sync(noop)
            plain.append(time.perf_counter() - t)
            t = time.perf_counter()
            cluster.run(noop)
            mixle.append(time.perf_counter() - t)
    finally:
        cluster.stop()
    return start_s, statistics.median(plain), statistics.median(mixle)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--calls", type=int, default=200)
    args = parser.parse_args()
    print(f"{'n':>2} {'plain start s':>14} {'mixle start s':>14} "
          f"{'apply_sync ms':>14} {'run ms':>8} {'ratio':>6}")
    for n in args.sizes:
        plain_start = time_plain_start(n)
        mixle_start, plain_rt, mixle_rt = time_mixle(n, args.calls)
        print(f"{n:>2} {plain_start:>14.2f} {mixle_start:>14.2f} "
              f"{plain_rt * 1e3:>14.2f} {mixle_rt * 1e3:>8.2f} {mixle_rt / plain_rt:>6.2f}")


if __name__ == "__main__":
    main()
