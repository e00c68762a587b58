"""Fail together: when one rank's part of an SPMD operation raises, every rank raises at once.

A rank that fails does not leave its peers waiting in the next collective. It still takes part
in the exchange the operation already makes, carrying a status word instead of (or beside) its
result; when any status says "failed", every rank joins one more exchange — only on that
failure path — that shares each failed rank's message. The failed rank then re-raises its own
error; every other rank raises :class:`PeerRankError`, naming the failed rank(s) and their
messages, so a cluster can tell the root cause (the original error) from its consequences.
"""
from __future__ import annotations

from typing import Any, Mapping, Optional

import torch.distributed as dist


class PeerRankError(RuntimeError):
    """Another rank failed in the SPMD operation this rank was taking part in.

    ``failures`` maps each failed group rank to its error message; ``rank`` and ``message``
    are the lowest failed rank's. ``str()`` reads ``rank 1: <its message>`` (one clause per
    failed rank), prefixed by the operation when one was named.
    """

    def __init__(self, failures: Mapping[int, str], operation: str = ""):
        if not failures:
            raise ValueError("PeerRankError needs at least one failed rank")
        self.failures = dict(sorted(failures.items()))
        self.operation = operation
        self.rank, self.message = next(iter(self.failures.items()))
        text = "; ".join(f"rank {rank}: {message}" for rank, message in self.failures.items())
        super().__init__(f"{operation} failed on another rank: {text}" if operation else text)

    def __reduce__(self):  # keep the fields through pickling (ipyparallel, run_local)
        return type(self), (self.failures, self.operation)


def failure_message(error: BaseException) -> str:
    """What a peer is told: the error's own text, or its type when the text is empty."""
    if isinstance(error, PeerRankError):  # pass the root cause on, not "another rank failed"
        return "; ".join(f"rank {r}: {m}" for r, m in error.failures.items())
    return str(error) or type(error).__name__


def raise_together(local_error: Optional[BaseException], group: Any = None, world: int = 1,
                   operation: str = "") -> None:
    """The failure path, entered by every rank once any status word said "failed".

    Gathers each rank's failure message (one object collective), then re-raises this rank's
    own error if it had one, else raises :class:`PeerRankError`. Never returns."""
    local = None if local_error is None else failure_message(local_error)
    messages: list = [local] * world
    if world > 1:
        dist.all_gather_object(messages, local, group=group)
    failures = {rank: text for rank, text in enumerate(messages) if text is not None}
    if local_error is not None:
        raise local_error
    if not failures:
        raise RuntimeError(f"{operation or 'an SPMD operation'}: a status word said a rank failed, "
                           "but no rank sent a failure message")
    raise PeerRankError(failures, operation)
