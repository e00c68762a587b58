"""Calls on a cluster's ranks: run a function, run code, push, pull and scatter values.

:class:`RankCalls` is the data API of :class:`~mixle_nb.cluster.MixleCluster`. Every call goes
through one prologue (:meth:`RankCalls._start_call`): its ranks checked, the cluster checked to
be usable and its ranks alive, then one non-blocking ipyparallel request wrapped in a
:class:`~.calls.RankCall`, which the cluster supervises (:mod:`.supervision`) while it runs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from .. import validation
from . import engine
from .calls import RankCall
from .supervision import CallSupervision

if TYPE_CHECKING:
    from .handle_reference import HandleReference

# which ranks a call runs on: one rank, several, or (None) every rank
Targets = int | Sequence[int] | None


def apply_call(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Callable[[Any], Any]:
    """A call's launch: ``fn(*args, **kwargs)`` on a view's engines, not waiting."""
    return lambda view: view.apply_async(fn, *args, **kwargs)


def _push_call(values: dict[str, Any]) -> Callable[[Any], Any]:
    """A call's launch: bind ``values`` on a view's engines, not waiting."""
    return lambda view: view.push(values, block=False)


class RankCalls(CallSupervision):
    """Functions, code and values on a cluster's ranks (rank r is the engine ``_engine_ids[r]``).

    Every method takes the ranks as ``targets``: one rank, a list of ranks, or None for every
    rank. The cluster provides ``_views`` (ipyparallel views by ranks, cached until the ranks
    change); the rest comes from :class:`~.supervision.CallSupervision`.
    """

    _views: dict[tuple[int, ...], Any]

    def _targets(self, targets: Targets) -> list[int]:
        if targets is None:
            return list(range(self.n))
        ranks = [targets] if not isinstance(targets, (list, tuple, range)) else list(targets)
        if not ranks:
            raise ValueError(f"targets must be ranks in 0..{self.n - 1}, got {targets!r}")
        checked = [validation.integer("targets", r, minimum=0) for r in ranks]
        bad = [r for r in checked if r >= self.n]
        if bad:
            raise ValueError(f"targets must be ranks in 0..{self.n - 1}, got {targets!r}")
        return checked

    def _view_on(self, ranks: list[int]) -> Any:
        key = tuple(ranks)
        if key not in self._views:
            view = self._views[key] = self._processes.client[[self._engine_ids[r] for r in ranks]]
            view.label = engine.call_label(ranks)  # tells the ranks who else runs the call
        return self._views[key]

    def _start_call(self, targets: Targets, launch: Callable[[Any], Any], check: bool = True) -> RankCall:
        """The prologue of every call: resolve ``targets``, check the cluster can take the call,
        then ``launch(view)`` (a non-blocking ipyparallel request) as a :class:`RankCall`."""
        ranks = self._targets(targets)
        if check:
            self._require_usable(ranks)
        return RankCall(self, ranks, launch(self._view_on(ranks)))

    def run_async(self, fn: Callable[..., Any], *args: Any, targets: Targets = None, **kwargs: Any) -> RankCall:
        """Start ``fn(*args, **kwargs)`` on every rank (or on ``targets``).

        Parameters
        ----------
        fn : callable
            A picklable function (a module's, or one ipyparallel can ship).
        *args
            Its positional arguments, pickled to every rank.
        targets : int or sequence of int, optional
            The ranks to run it on; every rank if None.
        **kwargs
            Its keyword arguments, pickled to every rank.

        Returns
        -------
        RankCall
            The running call: ``result()`` waits for the per-rank results.

        Raises
        ------
        ValueError
            ``targets`` are not ranks of this cluster.
        RuntimeError
            The cluster is not running (or needs ``restart()``).
        RankDiedError
            A rank of ``targets`` has died.
        """
        return self._start_call(targets, apply_call(fn, *args, **kwargs))

    def execute_async(self, code: str, targets: Targets = None) -> RankCall:
        """Start running ``code`` in every rank's namespace (or ``targets``').

        Parameters
        ----------
        code : str
            Python source, run as a cell would be on each rank.
        targets : int or sequence of int, optional
            The ranks to run it on; every rank if None.

        Returns
        -------
        RankCall
            The running call; its output is in ``RankCall.stdout`` while it runs.

        Raises
        ------
        ValueError, RuntimeError, RankDiedError
            As :meth:`run_async`.
        """
        return self._start_call(targets, lambda view: view.execute(code, silent=False, block=False))

    def run(self, fn: Callable[..., Any], *args: Any, targets: Targets = None, **kwargs: Any) -> list[Any]:
        """Run ``fn(*args, **kwargs)`` on every rank (or on ``targets``), waiting for it.

        Parameters
        ----------
        fn : callable
            A picklable function (a module's, or one ipyparallel can ship).
        *args
            Its positional arguments, pickled to every rank.
        targets : int or sequence of int, optional
            The ranks to run it on; every rank if None.
        **kwargs
            Its keyword arguments, pickled to every rank.

        Returns
        -------
        list
            Each rank's result, in the order of the ranks.

        Raises
        ------
        RankError
            It raised on some rank (named by the root cause, see :class:`~.calls.RankError`).
        RankDiedError
            A rank died before or while it ran.
        ValueError, RuntimeError
            As :meth:`run_async`.
        """
        return self.run_async(fn, *args, targets=targets, **kwargs).result()

    def handle(self, name: str) -> HandleReference:
        """A reference to the handle bound to ``name`` on every rank.

        For calls that run where the data live, e.g.
        ``GaussianMixture.fit(cluster.handle("h"))``.

        Parameters
        ----------
        name : str
            The handle's name on the ranks.

        Returns
        -------
        HandleReference
            The reference (``mixle_nb.cluster.handle_reference``).
        """
        from .handle_reference import HandleReference

        return HandleReference(self, name)

    def push(self, targets: Targets = None, **values: Any) -> None:
        """Bind ``values`` as globals on every rank (or on ``targets``).

        Parameters
        ----------
        targets : int or sequence of int, optional
            The ranks to bind them on; every rank if None.
        **values
            Name -> value, pickled to the ranks.

        Raises
        ------
        RankError, RankDiedError, ValueError, RuntimeError
            As :meth:`run`.
        """
        self._start_call(targets, _push_call(values)).result()

    def pull(self, name: str, rank: int | str = 0) -> Any:
        """The global ``name`` from one rank, or from every rank.

        Parameters
        ----------
        name : str
            A global name on the ranks.
        rank : int or "all", default 0
            The rank to read it from; ``"all"`` reads it from every rank.

        Returns
        -------
        object or list
            The value, or a per-rank list for ``rank="all"``.

        Raises
        ------
        ValueError
            ``rank`` is neither a rank of this cluster nor "all".
        RankError
            ``name`` is not defined there (a ``NameError`` on the rank).
        """
        if isinstance(rank, str) and rank != "all":
            raise ValueError(f"rank must be a rank or 'all'; got {rank!r}")
        targets = None if isinstance(rank, str) else rank
        values = self._start_call(targets, lambda view: view.pull(name, block=False)).result()
        return values if rank == "all" else values[0]

    def scatter(self, name: str, sequence: Sequence[Any]) -> None:
        """Bind ``name`` on rank r to ``sequence[r::n]``.

        Parameters
        ----------
        name : str
            The name bound on each rank.
        sequence : sequence
            The values dealt out, rank r getting every n-th from the r-th.

        Raises
        ------
        RankError, RankDiedError, ValueError, RuntimeError
            As :meth:`run`.
        """
        calls = [self._start_call(r, _push_call({name: sequence[r :: self.n]})) for r in range(self.n)]
        for call in calls:
            call.result()
