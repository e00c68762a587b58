"""Functions the cluster and process-group tests run on every rank. They live in a module of
their own so that engines import them by reference (tests/ is on the engines' PYTHONPATH, see
conftest.py)."""

import time

import numpy as np


def outcome(fn):
    """What ``fn()`` raised on this rank (type, message) and how long it took to raise."""
    start = time.perf_counter()
    try:
        fn()
    except Exception as exc:
        return type(exc).__name__, str(exc), time.perf_counter() - start
    return None, None, time.perf_counter() - start


def allreduce_sum(value):
    """The sum of ``value`` over the ranks, through one gloo all-reduce."""
    import torch
    import torch.distributed as dist

    t = torch.tensor([float(value)])
    dist.all_reduce(t)
    return t.item()


def late_allreduce(late_rank, delay):
    """``late_rank`` joins the collective after ``delay`` s; the others block in it meanwhile."""
    import torch.distributed as dist

    if dist.get_rank() == late_rank:
        time.sleep(delay)
    return allreduce_sum(1)


_finished: dict = {}  # call id -> whether this rank finished it (the EM panel's queued calls, in small)


def slow_after_collective(call_id: str, slow_rank: int, delay: float) -> None:
    """One all-reduce, then ``slow_rank`` works on for ``delay`` s before it counts the call as
    finished: an interrupt there leaves the call finished on the other ranks only."""
    import torch.distributed as dist

    allreduce_sum(1)
    if dist.get_rank() == slow_rank:
        time.sleep(delay)
    _finished[call_id] = True


def collective_after(call_id: str) -> float | None:
    """Queued behind ``call_id``: one all-reduce if that call finished on this rank, else none
    (so a rank where it was interrupted skips, and the others wait in the collective alone)."""
    return allreduce_sum(1) if _finished.get(call_id) else None


def params(model) -> np.ndarray:
    """Every number of a model, flattened, for exact or toleranced comparison."""
    from mixle_nb.stats import (
        CategoricalDistribution,
        MixtureDistribution,
        MultivariateGaussianDistribution,
        PoissonDistribution,
    )

    if isinstance(model, MixtureDistribution):
        return np.concatenate([model.w] + [params(c) for c in model.components])
    if isinstance(model, CategoricalDistribution):
        return np.array([model.pmap[k] for k in sorted(model.pmap)])
    if isinstance(model, MultivariateGaussianDistribution):
        return np.concatenate([model.mu, model.covar.ravel()])
    if isinstance(model, PoissonDistribution):
        return np.array([model.lam])
    return np.atleast_1d(np.concatenate([np.atleast_1d(model.mu), np.atleast_1d(model.sigma2)]))


EM_STEPS = 5


def em_steps(handle, estimator, model, steps: int = EM_STEPS):
    """(the parameters after ``steps`` EM steps from ``model``, the log-density of each step)."""
    from mixle_nb.stats import em_step

    log_densities = []
    for _ in range(steps):
        step = em_step(handle, estimator, model)
        model = step.model
        log_densities.append(step.log_density)
    return params(model), log_densities


def build_elastic_handle(name: str, path: str, shards=None, sub_chunks: int = 2):
    """Bind ``name`` on this rank to an elastic 2-Gaussian-mixture handle on the ``.npy`` file."""
    from mixle_nb.cluster.rank_side import rank_namespace
    from mixle_nb.parallel.em_handle import TorchRunEncodedData

    est = _elastic_estimator()
    rank_namespace()[name] = TorchRunEncodedData.from_npy(path, est, shards=shards, sub_chunks=sub_chunks, elastic=True)
    rank_namespace()["est"] = est


def _elastic_estimator():
    from mixle_nb.stats import GaussianEstimator, MixtureEstimator

    return MixtureEstimator([GaussianEstimator()] * 2)


def _kill_at(phase, step, at_phase, at_step, stamp):
    import os
    import signal

    if phase == at_phase and (at_step is None or step == at_step):
        if stamp is not None:  # when it died, for a benchmark's clock (same host)
            with open(stamp, "w") as f:
                f.write(repr(time.time()))
        os.kill(os.getpid(), signal.SIGKILL)  # kill -9, as from outside, at a chosen point


def arm_kill(name: str, phase: str, step=None, stamp=None):
    """This rank dies (SIGKILL) when the handle ``name`` reaches ``phase`` of EM step ``step``
    (any step: ``None``), first writing the time to the file ``stamp`` if given; see
    TorchRunEncodedData._phase."""
    import functools

    from mixle_nb.cluster.rank_side import lookup

    lookup(name).phase_hook = functools.partial(_kill_at, at_phase=phase, at_step=step, stamp=stamp)


def arm_stall(name: str, phase: str, step: int, stamp: str, seconds: float):
    """This rank stops (sleeps ``seconds``) when the handle ``name`` reaches ``phase`` of EM
    step ``step``, first creating the file ``stamp``: the moment a test takes its link down."""
    import functools

    from mixle_nb.cluster.rank_side import lookup

    lookup(name).phase_hook = functools.partial(_stall_at, at_phase=phase, at_step=step, stamp=stamp, seconds=seconds)


def _stall_at(phase, step, at_phase, at_step, stamp, seconds):
    if phase == at_phase and step == at_step:
        open(stamp, "w").close()
        time.sleep(seconds)


def elastic_reference(path: str, start, steps: int, shards: int, sub_chunks: int = 2) -> list:
    """Every step's parameters (bytes) of EM from the 2-component ``start`` in one process on
    the ``.npy`` file ``path`` with the estimator, shards and parts of
    :func:`build_elastic_handle`: what an elastic run must equal."""
    from mixle_nb.parallel.em_handle import TorchRunEncodedData
    from mixle_nb.stats import em_step

    est = _elastic_estimator()
    model, out = start, []
    with TorchRunEncodedData.from_npy(
        path, est, shards=shards, sub_chunks=sub_chunks, init_process_group=False
    ) as handle:
        for _ in range(steps):
            model = em_step(handle, est, model).model
            out.append(params(model).tobytes())
    return out


def build_in_memory_handle(name: str):
    """Bind ``name`` on this rank to a handle on data in memory (every rank the same 40 values)."""
    from mixle_nb.cluster.rank_side import rank_namespace
    from mixle_nb.parallel.em_handle import TorchRunEncodedData
    from mixle_nb.stats import GaussianEstimator, MixtureEstimator

    est = MixtureEstimator([GaussianEstimator()] * 2)
    rank_namespace()[name] = TorchRunEncodedData(np.linspace(-3.0, 3.0, 40), est)
    rank_namespace()["est"] = est


def close_named(name: str):
    from mixle_nb.cluster.rank_side import rank_namespace

    rank_namespace().pop(name).close()
