"""Fault injection on a real 2-engine cluster: real gloo, real signals, real kill -9.

Each fault asserts who is named (rank and message), how long the error took (a loose bound that
still fails on a hang: the session cluster's group timeout is 20 s) and the state afterwards:
``running`` on the same engine pids with a working group, or ``broken`` and recovered by one
``restart()``. Times to error are printed by ``benchmarks/fault_bench.py``.
"""

from __future__ import annotations

import io
import os
import signal
import time

import numpy as np
import pytest
from interrupts import interrupt_after, kernel_interrupts
from rank_functions import allreduce_sum, collective_after, late_allreduce, slow_after_collective

from mixle_nb.cluster import RankDiedError, RankError
from mixle_nb.magics import run_cell
from mixle_nb.stats import DiagonalGaussianDistribution, GaussianDistribution, MixtureDistribution

BOUND_S = 8.0  # the target is 2 s; a hang lasts the group timeout (20 s here) or forever
INTERRUPT_BOUND_S = 4.0  # from an interrupt to every rank stopped and the group formed again


# ---- functions run on the ranks (module level: engines import them from this file)


def build_handle(name="h", data="x", estimator="est", **options):
    """On a rank: a TorchRunEncodedData from the rank's globals, bound to ``name``."""
    from mixle_nb.cluster.rank_side import lookup, rank_namespace
    from mixle_nb.parallel import TorchRunEncodedData

    handle = TorchRunEncodedData(lookup(data), estimator=lookup(estimator), **options)
    rank_namespace()[name] = handle
    return handle.local_count


def build_handle_and_warnings(**options):
    """``build_handle`` on a rank, and the warnings it raised there."""
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        count = build_handle(**options)
    return count, [str(w.message) for w in caught]


def em_steps(steps, handle="h", estimator="est", model="model"):
    """``steps`` EM steps on a rank (each one E-step and one collective)."""
    from mixle_nb.cluster.rank_side import em_step_on_rank

    for _ in range(steps):
        out = em_step_on_rank(handle, estimator, model)
    return out.log_density


def train_fsdp2(fail_at=None):
    """Six FSDP2 training steps of a tiny causal LM on a rank; rank 1's forward raises at call
    ``fail_at`` (a stand-in for running out of memory), leaving rank 0 in FSDP's all-gather."""
    import torch.distributed as dist
    from test_streaming_handle import failing_model, handle

    from mixle_nb.neural import StreamingTransformerLeafEstimator

    model = failing_model(fail_at if dist.get_rank() == 1 else None)
    handle(max_steps=6, parallel="fsdp").pysp_seq_estimate(StreamingTransformerLeafEstimator(model, lr=1e-2), None)


def last_fault_time():
    """On a rank: the wall-clock time of the last fault injected there (``train_fsdp2``'s)."""
    from test_streaming_handle import FAULT_TIME

    return FAULT_TIME[-1]


def interrupted_between_folds():
    """Where Ctrl-C can catch two ranks in a run of folds: rank 0 just after issuing a fold that
    rank 1 never joins, rank 1 still holding its previous fold's request (its traceback keeps
    the request, and with it gloo's connections, alive)."""
    import torch
    import torch.distributed as dist

    t = torch.ones(4)
    request = dist.all_reduce(t, async_op=True)
    request.wait()
    if dist.get_rank() == 0:
        request = dist.all_reduce(t, async_op=True)  # noqa: F841 - left in flight
    raise KeyboardInterrupt


def close_handle(name="h"):
    from mixle_nb.cluster.rank_side import rank_namespace

    handle = rank_namespace().pop(name, None)
    if handle is not None:
        handle.close()


# ---- helpers


def mixture(k=2, d=None):
    if d is None:
        return MixtureDistribution([GaussianDistribution(float(i), 1.0) for i in range(k)], [1 / k] * k)
    return MixtureDistribution(
        [DiagonalGaussianDistribution(np.full(d, float(i)), np.ones(d)) for i in range(k)], [1 / k] * k
    )


def engine_pids(cluster):
    return [r.pid for r in cluster.status()]


def assert_running_and_usable(cluster, pids):
    """Same engines, still running, and the group works."""
    assert cluster.state == "running", cluster.broken_reason
    assert engine_pids(cluster) == pids
    assert cluster.run(allreduce_sum, 1) == [2.0, 2.0]


def time_error(fn, *args, **kwargs):
    """(the exception ``fn`` raised, seconds it took)."""
    t0 = time.monotonic()
    try:
        fn(*args, **kwargs)
    except BaseException as exc:  # noqa: B902 - KeyboardInterrupt is one of the faults
        return exc, time.monotonic() - t0
    raise AssertionError(f"{fn.__name__} raised nothing")


@pytest.fixture
def sigint_raises():
    with kernel_interrupts():
        yield


@pytest.fixture
def cluster(cluster2):
    """The session cluster, its handle ``h`` closed afterwards; a test that broke it restarts it
    after recording what it asserts (so a needed restart still fails the test)."""
    yield cluster2
    if cluster2.state != "running":
        cluster2.restart()
    else:
        cluster2.run(close_handle)


def push_problem(cluster, n=4000, k=2):
    x = np.random.default_rng(0).normal(size=n)
    model = mixture(k)
    cluster.push(x=x, est=model.estimator(), model=model)
    return x, model


# ---- bad input on the cluster: a clear error naming the rank, before any hang


@pytest.mark.cluster
def test_nan_on_one_rank_names_that_rank(cluster):
    x, _ = push_problem(cluster)
    x[3] = np.nan  # data[rank::2]: only rank 1 sees index 3
    cluster.push(x=x)
    pids = engine_pids(cluster)
    err, seconds = time_error(cluster.run, build_handle)
    assert isinstance(err, RankError) and err.rank == 1, err
    assert "nan" in err.evalue.lower(), err
    assert seconds < BOUND_S
    assert_running_and_usable(cluster, pids)


@pytest.mark.cluster
def test_wrong_dimensionality_on_one_rank(cluster):
    model = mixture(2, d=2)
    cluster.push(est=model.estimator(), x=np.zeros((40, 2)))
    cluster.push(x=np.zeros((40, 3)), targets=[1])
    pids = engine_pids(cluster)
    err, seconds = time_error(cluster.run, build_handle)
    assert isinstance(err, RankError) and err.rank == 1, err
    assert "dimension" in str(err).lower(), err
    assert seconds < BOUND_S
    assert_running_and_usable(cluster, pids)


@pytest.mark.cluster
@pytest.mark.parametrize("root_only", [False, True])
def test_fewer_observations_than_ranks(cluster, root_only):
    """Not an error, as in mixle's handle (interchangeability): the empty rank contributes zero
    statistics, and the model is single-process EM's. It neither hangs nor breaks the cluster,
    and the root warns, naming the empty ranks and the fix."""
    cluster.push(x=np.array([0.5]), est=mixture().estimator())
    pids = engine_pids(cluster)
    t0 = time.monotonic()
    (count0, warned0), (count1, warned1) = cluster.run(build_handle_and_warnings, root_only=root_only)
    assert [count0, count1] == [1, 0]
    assert time.monotonic() - t0 < BOUND_S
    assert len(warned0) == 1 and "ranks [1] of 2 hold no observations" in warned0[0], warned0
    assert "start fewer ranks" in warned0[0] and warned1 == []
    assert_running_and_usable(cluster, pids)
    if not root_only:  # %%mixle shows the ranks' warnings
        err = io.StringIO()
        cell = "from mixle_nb.parallel import TorchRunEncodedData\nh = TorchRunEncodedData(x, estimator=est)\n"
        run_cell(cluster, cell, out=open(os.devnull, "w"), err=err)
        assert "ranks [1] of 2 hold no observations" in err.getvalue()


@pytest.mark.cluster
def test_root_only_without_data_on_the_root(cluster):
    cluster.push(x=None, est=mixture().estimator())
    cluster.push(x=np.zeros(10), targets=[1])
    pids = engine_pids(cluster)
    err, seconds = time_error(cluster.run, build_handle, root_only=True)
    assert isinstance(err, RankError) and err.rank == 0, err
    assert "root" in str(err).lower(), err
    assert seconds < BOUND_S
    assert_running_and_usable(cluster, pids)


@pytest.mark.cluster
def test_different_estimator_on_one_rank(cluster):
    push_problem(cluster)
    cluster.push(est=mixture(3).estimator(), model=mixture(3), targets=[1])
    pids = engine_pids(cluster)
    t0 = time.monotonic()
    with pytest.raises(RankError) as info:
        cluster.run(build_handle)
        cluster.run(em_steps, 1)
    seconds = time.monotonic() - t0
    assert info.value.rank == 1 and "rank 1" in str(info.value), info.value
    assert seconds < BOUND_S
    assert_running_and_usable(cluster, pids)


def assert_names_the_targets(err, rank, operation):
    assert isinstance(err, RankError) and err.rank == rank, err
    assert f"{operation} needs every rank of the group" in err.evalue, err
    assert f"this call runs on ranks [{rank}] of [0, 1]" in err.evalue and "--targets" in err.evalue, err


@pytest.mark.cluster
def test_handle_built_on_some_ranks_only(cluster):
    """No rank waits for the group timeout: the call's ranks travel with it, and the handle
    refuses before its first collective."""
    push_problem(cluster)
    pids = engine_pids(cluster)
    err, seconds = time_error(cluster.run, build_handle, targets=[0])
    assert_names_the_targets(err, 0, "building a TorchRunEncodedData")
    assert seconds < 2.0
    assert_running_and_usable(cluster, pids)
    cell = "from mixle_nb.parallel import TorchRunEncodedData\nh = TorchRunEncodedData(x, estimator=est)\n"
    err, seconds = time_error(run_cell, cluster, cell, targets=[1], out=open(os.devnull, "w"))
    assert_names_the_targets(err, 1, "building a TorchRunEncodedData")  # %%mixle --targets 1
    assert seconds < 2.0
    assert_running_and_usable(cluster, pids)


@pytest.mark.cluster
def test_em_step_on_some_ranks_only(cluster):
    push_problem(cluster)
    cluster.run(build_handle)
    pids = engine_pids(cluster)
    err, seconds = time_error(cluster.run, em_steps, 1, targets=[1])
    assert_names_the_targets(err, 1, "an EM step on a TorchRunEncodedData")
    assert seconds < 2.0
    assert_running_and_usable(cluster, pids)
    assert len(set(cluster.run(em_steps, 1))) == 1  # the handle still works on every rank


# ---- a rank fails inside a step


@pytest.mark.cluster
def test_exception_in_one_ranks_e_step_fails_every_rank_promptly(cluster):
    push_problem(cluster)
    cluster.run(build_handle)
    cluster.push(model="not a model", targets=[1])  # rank 1 fails in its E-step; rank 0 folds
    pids = engine_pids(cluster)
    err, seconds = time_error(cluster.run, em_steps, 1)
    assert isinstance(err, RankError) and err.rank == 1, err
    assert err.ename == "AttributeError"
    assert [r for r, _, _ in err.errors] == [0, 1]  # rank 0's consequence is listed too
    assert seconds < BOUND_S
    assert_running_and_usable(cluster, pids)


@pytest.mark.cluster
def test_exception_in_one_ranks_fsdp2_step_fails_every_rank_promptly(cluster):
    """Promptly: timed from the fault on rank 1 (the engines share this host's clock) to the error
    here, not from the call, whose imports, model and FSDP wrapping before the fault a loaded host
    slows by seconds; rank 0 left waiting in FSDP's all-gather would take the group timeout."""
    pids = engine_pids(cluster)
    err, _ = time_error(cluster.run, train_fsdp2, 3)
    raised = time.time()
    assert isinstance(err, RankError) and err.rank == 1, err
    assert "forward call 3 ran out of memory" in err.evalue
    assert [(r, name) for r, name, _ in err.errors] == [(0, "PeerRankError"), (1, "RuntimeError")]
    (injected,) = cluster.run(last_fault_time, targets=[1])
    assert 0 < raised - injected < cluster.timeout / 2
    assert_running_and_usable(cluster, pids)  # the group the failed rank severed is formed again
    cluster.run(train_fsdp2)


def test_root_cause_is_named_first_whichever_rank_fails():
    from mixle_nb.cluster.calls import RankError as Error
    from mixle_nb.cluster.calls import is_consequence
    from mixle_nb.parallel.fail_together import PeerRankError

    class Remote:  # the fields of ipyparallel's RemoteError that RankError reads
        def __init__(self, ename, evalue):
            self.ename, self.evalue, self.traceback = ename, evalue, f"{ename}: {evalue}"

    assert is_consequence(PeerRankError.__name__, "")
    timeout = Remote("RuntimeError", "[gloo] Timed out waiting 60000ms for send operation to complete")
    cause = Remote("ValueError", "observation 1 is NaN or infinite; drop or impute it first")
    err = Error.from_failures([(0, timeout), (1, cause)])
    assert (err.rank, err.ename) == (1, "ValueError")
    assert str(err).startswith("rank 1 raised ValueError: observation 1 is NaN")
    assert "rank 0 then raised RuntimeError" in str(err) and len(err.errors) == 2
    peer = Remote("PeerRankError", "em step failed on another rank: rank 1: boom")
    assert Error.from_failures([(0, peer), (1, Remote("KeyError", "boom"))]).rank == 1


# ---- kill -9 mid-work: RankDiedError within about a second, restart() recovers


def kill_during(cluster, fn, *args, after=1.0, victim=1):
    call = cluster.run_async(fn, *args)
    time.sleep(after)
    os.kill(cluster.status()[victim].pid, signal.SIGKILL)
    return time_error(call.result)


@pytest.mark.cluster
def test_kill_9_during_an_em_step(cluster):
    push_problem(cluster, n=200_000, k=4)
    cluster.run(build_handle)
    err, seconds = kill_during(cluster, em_steps, 100_000)
    assert isinstance(err, RankDiedError) and err.ranks == [1], err
    assert seconds < 2.0
    assert cluster.state == "broken"
    with pytest.raises(RankDiedError):
        cluster.run(allreduce_sum, 1)
    cluster.restart()
    assert cluster.run(allreduce_sum, 1) == [2.0, 2.0]


@pytest.mark.cluster
def test_kill_9_during_a_collective(cluster):
    err, seconds = kill_during(cluster, late_allreduce, 1, 60)  # rank 0 waits in all_reduce
    assert isinstance(err, RankDiedError) and err.ranks == [1], err
    assert seconds < 2.0
    assert cluster.state == "broken"
    cluster.restart()
    assert cluster.run(allreduce_sum, 1) == [2.0, 2.0]


# ---- Ctrl-C during each blocking call: every rank stops, same engines, next call works


@pytest.mark.cluster
def test_ctrl_c_during_run_inside_a_collective(cluster, sigint_raises):
    pids = engine_pids(cluster)
    interrupt_after(1.0)
    err, seconds = time_error(cluster.run, late_allreduce, 1, 60)
    assert isinstance(err, KeyboardInterrupt)
    assert seconds < 1.0 + BOUND_S
    assert_running_and_usable(cluster, pids)


@pytest.mark.cluster
def test_ctrl_c_during_em_steps(cluster, sigint_raises):
    push_problem(cluster, n=100_000, k=4)
    cluster.run(build_handle)
    pids = engine_pids(cluster)
    interrupt_after(1.0)
    err, seconds = time_error(cluster.run, em_steps, 100_000)
    assert isinstance(err, KeyboardInterrupt)
    assert seconds < 1.0 + INTERRUPT_BOUND_S
    assert_running_and_usable(cluster, pids)
    cluster.push(model=mixture(4))
    cluster.run(close_handle)
    cluster.run(build_handle)  # the next EM call works on the same engines
    assert len(set(cluster.run(em_steps, 2))) == 1


@pytest.mark.cluster
def test_a_collective_left_in_flight_does_not_hold_up_forming_the_group_again(cluster):
    """The race behind a Ctrl-C that once took the group timeout: re-forming the group waited
    for rank 0's orphaned fold until gloo timed it out, because rank 1's connections outlived
    its destroy. Every rank now shuts its connections down before leaving the group."""
    pids = engine_pids(cluster)
    err, seconds = time_error(cluster.run, interrupted_between_folds)
    assert isinstance(err, RankError) and err.ename == "KeyboardInterrupt", err
    assert seconds < INTERRUPT_BOUND_S  # the group is formed again before the error returns
    t0 = time.monotonic()
    assert_running_and_usable(cluster, pids)  # no all-reduce pairs with the orphaned one
    assert time.monotonic() - t0 < INTERRUPT_BOUND_S


@pytest.mark.cluster
def test_cancelling_a_call_stops_the_call_queued_behind_it_on_every_rank(cluster):
    """The race behind a CI run whose Ctrl-C broke the cluster: the EM panel keeps a call queued
    behind the running one, and the interrupt landed on rank 1 after the running call's last
    collective, so rank 0 finished it and ran the queued call's steps alone, waiting in its first
    collective; forming the group again then waited behind it until the group timeout. Stopping
    the queued call with the running one releases it."""
    pids = engine_pids(cluster)
    running = cluster.run_async(slow_after_collective, "first", 1, 60)
    queued = cluster.run_async(collective_after, "first")
    deadline = time.monotonic() + 30
    while running.ranks_done() != [0]:  # rank 0 finished; rank 1 works on after the collective
        assert time.monotonic() < deadline, "rank 0 did not finish the first call"
        time.sleep(0.02)
    t0 = time.monotonic()
    running.cancel(queued=[queued])
    assert time.monotonic() - t0 < INTERRUPT_BOUND_S
    assert queued.done() and running.done()
    assert_running_and_usable(cluster, pids)


@pytest.mark.cluster
def test_ctrl_c_during_a_mixle_cell(cluster, sigint_raises):
    pids = engine_pids(cluster)
    code = "import torch, torch.distributed as dist\nt = torch.ones(100_000)\nwhile True:\n    dist.all_reduce(t)\n"
    interrupt_after(1.0)
    err, seconds = time_error(run_cell, cluster, code, out=open(os.devnull, "w"))
    assert isinstance(err, KeyboardInterrupt)
    assert seconds < 1.0 + BOUND_S
    assert_running_and_usable(cluster, pids)


@pytest.mark.cluster
def test_a_rank_that_cannot_be_stopped_is_reported_and_restart_recovers(cluster, sigint_raises):
    # a rank whose SIGINT is ignored stands for one stuck in C code that never returns
    interrupt_after(1.0)
    code = "import signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\ntime.sleep(60)\n"
    err, seconds = time_error(run_cell, cluster, code, out=open(os.devnull, "w"))
    assert isinstance(err, KeyboardInterrupt)
    assert seconds < 1.0 + 15.0  # the grace period is min(timeout, 10 s)
    assert cluster.state == "broken" and "did not stop" in cluster.broken_reason
    with pytest.raises(RuntimeError, match="restart"):
        cluster.run(allreduce_sum, 1)
    cluster.restart()
    assert cluster.run(allreduce_sum, 1) == [2.0, 2.0]
