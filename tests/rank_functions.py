"""Functions the cluster and process-group tests run on every rank. They live in a module of
their own so that engines import them by reference (tests/ is on the engines' PYTHONPATH, see
conftest.py)."""
import time


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
