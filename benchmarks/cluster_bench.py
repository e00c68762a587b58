"""MixleCluster against plain ipyparallel, side by side in one run.

    .venv/bin/python benchmarks/cluster_bench.py [--sizes 2 4] [--calls 200] [--baseline DIR] [--rounds 3]

Start: time from start() until the torch.distributed group is ready, against
``ipyparallel.Cluster(n=n).start_and_connect_sync()`` (engines registered, no torch).
Round trip: a no-op on every rank, ``MixleCluster.run`` against ``DirectView.apply_sync``,
interleaved on the same engines so both see the same machine load. With ``--baseline DIR``
(another checkout of mixle_nb), both checkouts are measured in ``rounds`` interleaved rounds,
each measurement in a fresh process whose PYTHONPATH (which its engines inherit) names the
checkout; the table gives each checkout's medians.

    .venv/bin/python benchmarks/cluster_bench.py --exposure [--sizes 2 4] [--rounds 3] [--calls 100]

Exposure (docs/guide/network-exposure.md): start() to group ready, a no-op round trip and a
step (an all-reduce of 100 000 floats on every rank), for the controller on Unix sockets (the
default on one host), on loopback TCP as before (no CurveZMQ, the engines' nannies and
heartbeat watches listening) and on loopback TCP with CurveZMQ (as across hosts), in
interleaved rounds.

    .venv/bin/python benchmarks/cluster_bench.py --probe [--trials 3] [--probe-rounds 50]

Probe (root): for each of those three, ``trials`` fresh 2-engine clusters, each probed as uid
``nobody`` (tests/shared_host_probe.py, ``probe-rounds`` rounds against every TCP port its processes
listen on) while it runs all-reduce calls; a call that has not returned in 60 s counts as hung.

    .venv/bin/python benchmarks/cluster_bench.py --launchers [--hosts 2] [--per-host 2] [--rounds 3]

    .venv/bin/python benchmarks/cluster_bench.py --peer [--rounds 3] [--calls 20]

Peer (2 ranks): MixleCluster against nbdistributed 0.1.0 (``%dist_init -n 2`` and ``%%distributed``
cells, run through an IPython shell's magics: benchmarks/nbdistributed_peer.py), in interleaved
rounds: start to ready (the start call returned, the first no-op answered, and for nbdistributed, in a
second start, its workers answering a no-op polled every 0.1 s), a no-op round
trip, a step (the all-reduce above) and a rank raising beside that all-reduce (the seconds until
the call returns, capped at 70 s). Written to ``cluster_peer_bench.json``.

Launchers (root: tests/multihost's simulated hosts, with Slurm on them): start() to group
ready for the same number of engines through the local launcher, ssh (``per-host`` engines on
each of ``hosts`` hosts) and Slurm (one sbatch job of the same tasks), in interleaved rounds.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import ipyparallel as ipp
from results import Table, add_json_argument, write_results

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


def time_start(n, **options):
    t0 = time.perf_counter()
    cluster = MixleCluster(n, **options).start()
    elapsed = time.perf_counter() - t0
    cluster.stop()
    return elapsed


EXPOSURES = {
    "unix sockets": {},
    "tcp (before)": {"controller_ip": "127.0.0.1", "controller_args": ["--IPController.enable_curve=False"]},
    "tcp + curve": {"controller_ip": "127.0.0.1"},
}


def allreduce_step():
    import torch
    import torch.distributed as dist

    t = torch.ones(100_000)
    dist.all_reduce(t)
    return float(t[0])


def time_exposure(n, calls, options):
    t0 = time.perf_counter()
    cluster = MixleCluster(n, **options).start()
    start_s = time.perf_counter() - t0
    try:
        for _ in range(10):  # warm up
            cluster.run(noop)
            cluster.run(allreduce_step)
        noop_s, step_s = [], []
        for _ in range(calls):
            t = time.perf_counter()
            cluster.run(noop)
            noop_s.append(time.perf_counter() - t)
            t = time.perf_counter()
            cluster.run(allreduce_step)
            step_s.append(time.perf_counter() - t)
    finally:
        cluster.stop()
    return start_s, statistics.median(noop_s), statistics.median(step_s)


def compare_exposures(sizes, rounds, calls):
    print(f"median of {rounds} interleaved rounds; round trips: median of {calls} calls")
    print(f"{'n':>2} {'controller':>14} {'start s':>8} {'no-op ms':>9} {'step ms':>8}")
    for n in sizes:
        results = {name: [] for name in EXPOSURES}
        for _ in range(rounds):
            for name, options in EXPOSURES.items():
                results[name].append(time_exposure(n, calls, options))
        for name, values in results.items():
            start_s, noop_s, step_s = (statistics.median(v) for v in zip(*values))
            print(f"{n:>2} {name:>14} {start_s:>8.2f} {noop_s * 1e3:>9.2f} {step_s * 1e3:>8.2f}")


HUNG_S = 60.0


def bounded_call(cluster, fn):
    """``"ok"``, ``"hung"`` (no answer within HUNG_S) or the error's name, of ``cluster.run(fn)``."""
    outcome = {}

    def call():
        try:
            cluster.run(fn)
            outcome["result"] = "ok"
        except Exception as exc:
            outcome["result"] = type(exc).__name__

    thread = threading.Thread(target=call, daemon=True)
    thread.start()
    thread.join(HUNG_S)
    return outcome.get("result", "hung")


PEER_CAP_S = 70.0


def raise_beside_allreduce():
    import torch
    import torch.distributed as dist

    t = torch.ones(100_000)
    if dist.get_rank() == 0:
        raise RuntimeError("rank 0 fails beside the all-reduce")
    dist.all_reduce(t)


def seconds_until_done(call, cap_s):
    """Seconds until ``call()`` returns or raises, and how; ``(None, "hung")`` past ``cap_s``."""
    outcome = {}

    def run():
        t = time.perf_counter()
        try:
            result = call()
            outcome["how"] = result if isinstance(result, str) else "returned"
        except Exception as exc:
            outcome["how"] = type(exc).__name__
        outcome["s"] = time.perf_counter() - t

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(cap_s)
    return outcome.get("s"), outcome.get("how", "hung")


def time_ours(calls):
    """Start, first no-op, no-op and step medians, the raise, and where the start went, on ``MixleCluster(2)``."""
    marks = {}
    t0 = time.perf_counter()
    cluster = MixleCluster(2).start(progress=lambda message: marks.setdefault(message, time.perf_counter() - t0))
    start_s = time.perf_counter() - t0
    phases = [
        marks["controller started"],
        marks["2/2 engines registered"],
        *(v for k, v in marks.items() if "group formed" in k),
    ]
    try:
        cluster.run(noop)
        first_s = time.perf_counter() - t0
        noop_s = [seconds_until_done(lambda: cluster.run(noop), PEER_CAP_S)[0] for _ in range(calls)]
        step_s = [seconds_until_done(lambda: cluster.run(allreduce_step), PEER_CAP_S)[0] for _ in range(calls)]
        fault = seconds_until_done(lambda: cluster.run(raise_beside_allreduce), PEER_CAP_S)
    finally:
        cluster.stop()
    return start_s, first_s, first_s, statistics.median(noop_s), statistics.median(step_s), fault, phases


def time_nbdistributed(calls):
    """The same on nbdistributed's ``%dist_init -n 2``, its cells through ``%%distributed``."""
    from nbdistributed_peer import RAISE_CELL, STEP_CELL, NbDistributed

    peer = NbDistributed(2)
    t0 = time.perf_counter()
    try:
        start_s = peer.start()
        peer.cell("pass")
        first_s = time.perf_counter() - t0
        noop_s = [peer.cell("pass") for _ in range(calls)]
        step_s = [peer.cell(STEP_CELL) for _ in range(calls)]
        fault = seconds_until_done(lambda: peer.raising_cell(RAISE_CELL), PEER_CAP_S)
    finally:
        peer.stop()
    try:  # a second start, polled with a no-op every 0.1 s until the workers answer
        polled_s = peer.start() + peer.answering()
    finally:
        peer.stop()
    return start_s, first_s, polled_s, statistics.median(noop_s), statistics.median(step_s), fault, None


def compare_peer(rounds, calls) -> list[Table]:
    peers = {"MixleCluster(2).start()": time_ours, "nbdistributed %dist_init -n 2": time_nbdistributed}
    results = {name: [] for name in peers}
    for _ in range(rounds):
        for name, measure in peers.items():
            results[name].append(measure(calls))
            print(name, results[name][-1], flush=True)
    table = Table(
        f"2 ranks: MixleCluster against nbdistributed 0.1.0, median of {rounds} interleaved rounds "
        f"(round trips: median of {calls} calls a round; a rank raising beside an all-reduce: "
        f"seconds until the call returns, capped at {PEER_CAP_S:.0f} s)",
        [
            "peer",
            "start returned s",
            "first no-op answered s",
            "answering when polled s",
            "no-op ms",
            "step ms",
            "rank raising s",
            "rank raising: how it ended",
        ],
    )
    for name, values in results.items():
        start_s, first_s, polled_s, noop_s, step_s = (statistics.median(v) for v in list(zip(*values))[:5])
        faults = [value[5] for value in values]
        hung = [how for s, how in faults if s is None]
        raised_s = f"hung >= {PEER_CAP_S:.0f}" if hung else statistics.median(s for s, _ in faults)
        how = ", ".join(sorted({how for _, how in faults}))
        table.add(name, start_s, first_s, polled_s, noop_s * 1e3, step_s * 1e3, raised_s, how)
    phases = Table(
        f"Where MixleCluster(2).start() goes: seconds from the call to each step (median of {rounds} rounds)",
        ["controller started s", "engines registered s", "group formed s", "start returned s"],
    )
    ours = results["MixleCluster(2).start()"]
    phases.add(
        *(statistics.median(v) for v in zip(*(value[6] for value in ours))), statistics.median(v[0] for v in ours)
    )
    return [table, phases]


def probe_clusters(trials, rounds):
    tests = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests")
    sys.path.insert(0, tests)
    from shared_host_probe import listening_ports, probe_while

    print(f"2 engines; per trial: the probe as nobody, {rounds} rounds, all-reduce calls meanwhile")
    print(f"{'controller':>14} {'tcp ports':>9} {'trials':>6} {'calls':>6} {'hung':>5} {'failed':>6}  dropped")
    for name, options in EXPOSURES.items():
        ports, calls, hung, failed, dropped = 0, 0, 0, 0, {}
        for trial in range(trials):
            cluster = MixleCluster(2, timeout=20.0, **options).start()
            try:
                targets = [str(port) for _, port, _ in listening_ports(cluster.pids)]
                ports = len(targets)
                outcomes = []

                def step(i):
                    if outcomes and outcomes[-1] != "ok":
                        time.sleep(0.1)  # a hung or broken cluster: wait for the probe to end
                        return
                    outcomes.append(bounded_call(cluster, allreduce_step))

                probe_while(step, [*targets, "--rounds", str(rounds), "--seed", str(trial)], 1)
                if outcomes[-1] == "ok":
                    outcomes.append(bounded_call(cluster, allreduce_step))  # the next call
                calls += len(outcomes)
                hung += outcomes.count("hung")
                failed += len(outcomes) - outcomes.count("ok") - outcomes.count("hung")
                for key, count in cluster.status().dropped.items():
                    dropped[key] = dropped.get(key, 0) + count
            finally:
                cluster.stop()
        print(f"{name:>14} {ports:>9} {trials:>6} {calls:>6} {hung:>5} {failed:>6}  {dropped or '-'}")


def time_launchers(hosts, per_host, rounds) -> Table:
    tests = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests")
    sys.path[:0] = [tests, os.path.join(tests, "multihost")]
    from simulated_hosts import SimulatedNetwork
    from slurm_hosts import SlurmOnHosts

    n = hosts * per_host
    with SimulatedNetwork(hosts) as net, SlurmOnHosts(net, cpus_per_host=per_host) as slurm:
        os.environ.update(
            slurm.environment(),
            PYTHONPATH=os.pathsep.join([os.path.dirname(tests), tests, os.path.join(tests, "multihost")]),
        )
        lo, hi = net.engine_ports[0], net.engine_ports[-1]
        ports = {"controller_ip": net.controller_ip, "controller_args": [f"--IPController.engine_ports={lo}-{hi}"]}
        ways = {
            "local": {},
            "ssh": {"launcher": "ssh", **net.cluster_options(engines_per_host=per_host)},
            "slurm": {"launcher": "slurm", "partition": slurm.partition, "ntasks_per_node": per_host, **ports},
        }
        seconds = {way: [] for way in ways}
        for _ in range(rounds):
            for way, options in ways.items():
                seconds[way].append(time_start(n, **options))
    print(
        f"start() to group ready, {n} engines ({hosts} hosts x {per_host} for ssh and slurm), "
        f"median of {rounds} interleaved rounds"
    )
    table = Table(
        f"start() to group ready, {n} engines ({hosts} hosts x {per_host} for ssh and Slurm), {rounds} interleaved rounds",
        ["launcher", "median s", "fastest s", "slowest s"],
    )
    for way, values in seconds.items():
        print(f"{way:>6} {statistics.median(values):6.2f} s   rounds: " + " ".join(f"{v:.2f}" for v in values))
        table.add(way, statistics.median(values), min(values), max(values))
    return table


def measure_one(n, calls):
    """Plain ipyparallel's start, then MixleCluster's start and both round trips, on ``n`` engines."""
    return [time_plain_start(n), *time_mixle(n, calls)]


def checkout_name(root):
    """The commit checked out at ``root`` (its folder's name if git cannot tell)."""
    git = subprocess.run(["git", "-C", root, "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return git.stdout.strip() or Path(root).name


def compare_checkouts(baseline, sizes, rounds, calls) -> Table:
    """Each size's start and round trips in this checkout and in ``baseline``, in interleaved rounds."""
    checkouts = {"before": str(Path(baseline).resolve()), "after": str(Path(__file__).resolve().parents[1])}
    results = {(n, name): [] for n in sizes for name in checkouts}
    for _ in range(rounds):
        for n in sizes:
            for name, root in checkouts.items():
                env = {**os.environ, "PYTHONPATH": root}
                command = [sys.executable, __file__, "--one", str(n), "--calls", str(calls)]
                out = subprocess.run(command, env=env, capture_output=True, text=True, check=True).stdout
                results[n, name].append(json.loads(out.splitlines()[-1]))
                print(n, name, results[n, name][-1], flush=True)
    table = Table(
        f"MixleCluster in {checkout_name(baseline)} (before) and in this checkout (after) against plain ipyparallel, "
        f"median of {rounds} interleaved rounds (round trip: median of {calls} no-op calls a round)",
        ["engines", "checkout", "plain start s", "MixleCluster start s", "apply_sync ms", "MixleCluster.run ms"],
    )
    for (n, name), values in results.items():
        plain_start, mixle_start, plain_rt, mixle_rt = (statistics.median(v) for v in zip(*values))
        table.add(n, name, plain_start, mixle_start, plain_rt * 1e3, mixle_rt * 1e3)
    return table


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)  # one measurement of n engines, as JSON
    parser.add_argument("--baseline", help="another checkout of mixle_nb, measured in interleaved rounds")
    parser.add_argument("--sizes", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--launchers", action="store_true", help="local, ssh and slurm starts")
    parser.add_argument("--hosts", type=int, default=2)
    parser.add_argument("--per-host", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--exposure", action="store_true", help="unix sockets, tcp and tcp + curve")
    parser.add_argument("--peer", action="store_true", help="against nbdistributed, 2 ranks")
    parser.add_argument("--probe", action="store_true", help="the shared-host probe against each (root)")
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--probe-rounds", type=int, default=50)
    add_json_argument(parser, "cluster_bench")
    args = parser.parse_args()
    if args.one:
        print(json.dumps(measure_one(args.one, args.calls)))
        return
    if args.baseline:
        write_results(
            args.json, "cluster_bench", 1, [compare_checkouts(args.baseline, args.sizes, args.rounds, args.calls)]
        )
        return
    if args.peer:
        tables = compare_peer(args.rounds, min(args.calls, 20))
        write_results(args.json.with_name("cluster_peer_bench.json"), "cluster_bench", 1, tables)
        return
    if args.probe:
        probe_clusters(args.trials, args.probe_rounds)
        return
    if args.exposure:
        compare_exposures(args.sizes, args.rounds, min(args.calls, 100))
        return
    if args.launchers:
        launchers = time_launchers(args.hosts, args.per_host, args.rounds)
        write_results(args.json.with_name(args.json.stem + "_launchers.json"), "cluster_bench", 1, [launchers])
        return
    table = Table(
        f"MixleCluster against plain ipyparallel (round trip: median of {args.calls} no-op calls)",
        [
            "engines",
            "plain start s",
            "MixleCluster start s",
            "apply_sync ms",
            "MixleCluster.run ms",
            "run / apply_sync",
        ],
    )
    print(f"{'n':>2} {'plain start s':>14} {'mixle start s':>14} {'apply_sync ms':>14} {'run ms':>8} {'ratio':>6}")
    for n in args.sizes:
        plain_start = time_plain_start(n)
        mixle_start, plain_rt, mixle_rt = time_mixle(n, args.calls)
        print(
            f"{n:>2} {plain_start:>14.2f} {mixle_start:>14.2f} "
            f"{plain_rt * 1e3:>14.2f} {mixle_rt * 1e3:>8.2f} {mixle_rt / plain_rt:>6.2f}"
        )
        table.add(n, plain_start, mixle_start, plain_rt * 1e3, mixle_rt * 1e3, mixle_rt / plain_rt)
    write_results(args.json, "cluster_bench", 1, [table])


if __name__ == "__main__":
    main()
