"""This process as a one-rank cluster: the call surface the panels use, run here at once.

A panel without a cluster steps its local objects through the same rank functions
(:mod:`.rank_side`) as on a cluster, so it has one code path: :class:`LocalRanks` binds the
objects in a namespace of its own (never the notebook's) and runs each call in it, in the
calling thread; a call's error is raised by its ``result()``, as a cluster call's is.
"""
from __future__ import annotations

from typing import Any, Callable

from . import rank_side


class LocalRanks:
    """``run``, ``run_async``, ``push`` and ``pull`` of a cluster of one rank, this process."""

    n = 1

    def __init__(self):
        self.namespace: dict = {}

    def run_async(self, fn: Callable, *args, targets=None, **kwargs) -> "DoneCall":
        """``fn(*args, **kwargs)`` run now, with the rank functions' names bound here."""
        with rank_side.in_namespace(self.namespace):
            try:
                return DoneCall(fn(*args, **kwargs))
            except BaseException as exc:  # Ctrl-C too: the panel records it as a failed step
                return DoneCall(error=exc)

    def run(self, fn: Callable, *args, targets=None, **kwargs) -> list:
        return self.run_async(fn, *args, **kwargs).result()

    def push(self, targets=None, **values: Any) -> None:
        self.namespace.update(values)

    def pull(self, name: str, rank: int | str = 0) -> Any:
        value = self.namespace[name]
        return [value] if rank == "all" else value


class DoneCall:
    """A call that has run: its one rank's result, or its error, raised by :meth:`result`."""

    ranks = [0]

    def __init__(self, value: Any = None, error: BaseException | None = None):
        self._value, self._error = value, error

    def result(self, timeout: float | None = None) -> list:
        if self._error is not None:
            raise self._error
        return [self._value]

    def cancelled(self) -> bool:
        return False

    def cancel(self, queued=()) -> None:
        """Nothing to stop: the call (and any queued behind it) has run."""
