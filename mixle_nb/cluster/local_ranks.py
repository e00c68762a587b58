"""This process as a one-rank cluster: the call surface the panels use, run here at once.

A panel without a cluster steps its local objects through the same rank functions
(:mod:`.rank_side`) as on a cluster, so it has one code path: :class:`LocalRanks` binds the
objects in a namespace of its own (never the notebook's) and runs each call in it, in the
calling thread; a call's error is raised by its ``result()``, as a cluster call's is. What a
call publishes (:func:`~.rank_side.publish`) reaches ``on_data`` as it is published, as
``{0: data}``: the call runs to its end before ``run_async`` returns, so its progress cannot
wait to be read from the call.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from . import rank_side


class LocalRanks:
    """``run``, ``run_async``, ``push`` and ``pull`` of a cluster of one rank, this process."""

    n = 1

    def __init__(self, on_data: Callable[[dict[int, Any]], None] = lambda data: None) -> None:
        self.namespace: dict[str, Any] = {}
        self.on_data = on_data

    def run_async(self, fn: Callable[..., Any], *args: Any, targets: object = None, **kwargs: Any) -> DoneCall:
        """``fn(*args, **kwargs)`` run now, with the rank functions' names bound here."""
        call = DoneCall()

        def publish(data: dict[str, Any]) -> None:
            call.data = {0: data}
            self.on_data(call.data)

        with rank_side.in_namespace(self.namespace, publish):
            try:
                call.value = fn(*args, **kwargs)
            except BaseException as exc:  # Ctrl-C too: the panel records it as a failed step
                call.error = exc
        return call

    def run(self, fn: Callable[..., Any], *args: Any, targets: object = None, **kwargs: Any) -> list[Any]:
        return self.run_async(fn, *args, **kwargs).result()

    def push(self, targets: object = None, **values: Any) -> None:
        self.namespace.update(values)

    def pull(self, name: str, rank: int | str = 0) -> Any:
        value = self.namespace[name]
        return [value] if rank == "all" else value


class DoneCall:
    """A call that has run: its one rank's result, or its error, raised by :meth:`result`;
    ``data`` is what it published last (``{0: data}``, or ``{}``), as a cluster call's."""

    ranks = [0]

    def __init__(self) -> None:
        self.value: Any = None
        self.error: BaseException | None = None
        self.data: dict[int, Any] = {}

    def result(self, timeout: float | None = None) -> list[Any]:
        if self.error is not None:
            raise self.error
        return [self.value]

    def cancelled(self) -> bool:
        return False

    def cancel(self, queued: Sequence[object] = ()) -> None:
        """Nothing to stop: the call (and any queued behind it) has run."""
