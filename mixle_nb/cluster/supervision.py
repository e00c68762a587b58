"""Supervising calls on the ranks: liveness, interrupts, stopping a call, repairing the group.

:class:`CallSupervision` is the half of :class:`~mixle_nb.cluster.MixleCluster` that a
:class:`~.calls.RankCall` talks to (the :class:`~.calls.Supervisor` protocol) and that elastic
recovery (:mod:`.elastic`) uses: which ranks died, SIGINT to ranks on any host, stopping every
rank of a call within about one step, and forming the group again when a failure may have left
a rank inside a collective. The cluster provides its processes (:mod:`.engine_processes`) and
the group itself (the attributes and the two methods declared on the class).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from . import engine
from .calls import POLL_S, RankCall, RankDiedError, collective_broken
from .engine_processes import EngineProcesses
from .state import ClusterState

INTERRUPT_SETTLE_S = 0.5  # after SIGINT, a rank still running is taken to sit in a collective
STOP_GRACE_S = 10.0  # the longest a rank may take to stop after the interrupt (at most the timeout)


def quiet(message: str) -> None:
    """A progress report that goes nowhere (the default ``report``)."""


class CallSupervision:
    """Liveness, interrupts and stopping calls, for a cluster whose ranks are engines.

    The base of :class:`~.rank_calls.RankCalls`, and so of :class:`~mixle_nb.cluster.MixleCluster`:
    it owns the lifecycle ``state`` and ``broken_reason``, each rank's last call (for the status
    table) and the lock that lets one thread at a time stop calls; the subclasses provide the
    rest declared here (``_view_on`` is :class:`~.rank_calls.RankCalls`', ``_form_group`` the
    cluster's).
    """

    # the cluster's
    n: int
    timeout: float
    _processes: EngineProcesses  # its engines (each rank's), its client and its Slurm job
    _engine_ids: list[int]  # the engine behind each rank
    # this half's own
    state: ClusterState
    broken_reason: str
    _last_call: dict[int, RankCall]
    _forming_group: bool
    _stopping: threading.Lock

    def _init_supervision(self) -> None:
        self.state, self.broken_reason = ClusterState.NEW, ""
        self._last_call = {}
        self._forming_group = False
        self._stopping = threading.Lock()  # a panel's worker and the main thread may both stop a call

    def _view_on(self, ranks: list[int]) -> Any:
        """An ipyparallel view on ``ranks`` (:class:`~.rank_calls.RankCalls` provides it)."""
        raise NotImplementedError

    def _form_group(self, report: Callable[[str], None] = quiet) -> None:
        """Form the group on every engine again (the cluster provides it)."""
        raise NotImplementedError

    def dead_ranks(self, ranks: Iterable[int]) -> list[int]:
        """Those of ``ranks`` whose engine has died or left the controller.

        Parameters
        ----------
        ranks : iterable of int
            The ranks to check.

        Returns
        -------
        list of int
            The dead ones (every rank once the Slurm job has ended).
        """
        if self._processes.job is not None and self._processes.job.ended():  # scancel, time limit, node down
            return list(ranks)
        registered = set(self._processes.client.ids)
        return [r for r in ranks if self._engine_ids[r] not in registered or not self._processes.ranks[r].alive()]

    def check_alive(self, ranks: Sequence[int]) -> None:
        """Raise if any of ``ranks`` died, marking the cluster broken.

        Parameters
        ----------
        ranks : sequence of int
            The ranks to check.

        Raises
        ------
        RankDiedError
            Some of them died.
        """
        dead = self.dead_ranks(ranks)
        if dead:
            raise self.ranks_died(dead)

    def ranks_died(self, ranks: Sequence[int]) -> RankDiedError:
        """Mark the cluster broken by the death of ``ranks``.

        Parameters
        ----------
        ranks : sequence of int
            The ranks that died.

        Returns
        -------
        RankDiedError
            The error to raise, saying how contact was lost (and the Slurm job's state).
        """
        self.mark_broken(f"ranks {sorted(ranks)} died")
        # seen from here, a killed remote engine and one whose host dropped off the network
        # are the same: the controller stopped hearing from it
        remote = any(r in self._processes.ranks and not self._processes.ranks[r].local for r in ranks)
        detail = " or lost contact (no heartbeat from its host)" if remote else ""
        if self._processes.job is not None:
            detail += f"; slurm job {self._processes.job.job_id} is {self._processes.job.final_state()}"
        return RankDiedError(ranks, detail)

    def mark_broken(self, reason: str) -> None:
        """Mark the group as untrustworthy until ``restart()``.

        Parameters
        ----------
        reason : str
            Why, kept in ``broken_reason``.
        """
        self.state, self.broken_reason = ClusterState.BROKEN, reason

    def call_finished(self, call: RankCall) -> None:
        """Remember a finished call, and repair the group after a failure if needed.

        The call is kept for the status table. After a failure the group is formed again if a
        rank's collective failed (timed out, lost its peer) or the ranks disagree on how many
        collectives they started: a rank that raised may have left one in flight.

        Parameters
        ----------
        call : RankCall
            A call with every rank's answer.
        """
        for r in call.ranks:
            self._last_call[r] = call
        if self._forming_group or call.stopped() or self.state != ClusterState.RUNNING or not call.failed_ranks():
            return  # a success, or stop_call has settled the group already
        errors = [e for e in call.outcomes() if hasattr(e, "ename")]
        broken = any(collective_broken(e.evalue) for e in errors)
        # a call on some ranks starts no collective that counts (the handles refuse it), and the
        # other ranks may be busy: asking them would wait behind their work
        if broken or len(call.ranks) == self.n:
            self._repair_group(severed=broken)

    def interrupt(self, ranks: Sequence[int]) -> None:
        """Send SIGINT to ``ranks``: a KeyboardInterrupt in their running task.

        An idle engine ignores it. By pid on this host, through the engines' nannies elsewhere.

        Parameters
        ----------
        ranks : sequence of int
            The ranks to interrupt.
        """
        remote = [r for r in ranks if not self._processes.ranks[r].local]
        for r in ranks:
            if self._processes.ranks[r].local:
                self._processes.ranks[r].interrupt()
        if remote:
            self._processes.client.send_signal("SIGINT", targets=[self._engine_ids[r] for r in remote], block=False)

    def stop_call(self, call: RankCall, queued: Sequence[RankCall] = ()) -> None:
        """Stop every rank still running ``call`` or a call queued behind it, keeping the engines.

        SIGINT first. A rank still running ``INTERRUPT_SETTLE_S`` later sits in a
        collective (or long C code), so every rank that has answered every call severs its
        group connections, which fails the collectives waiting on it at once. Then the group is
        formed again if it may be inconsistent. A rank that does not stop within the grace
        period marks the cluster broken. This takes about one step.

        The queued calls are stopped with ``call``: an interrupt landing on one rank after the
        last collective of ``call`` leaves it finished on the others only, so they run the next
        call's steps alone and wait in its first collective.

        Parameters
        ----------
        call : RankCall
            The call to stop.
        queued : sequence of RankCall, optional
            The calls sent after it.
        """
        with self._stopping:
            self._stop_calls([call, *queued])

    def _stop_calls(self, calls: list[RankCall]) -> None:
        if self.state != ClusterState.RUNNING:  # broken already: only restart() helps
            return

        def pending() -> list[int]:
            return sorted(set().union(*(c.pending() for c in calls)))

        grace = min(self.timeout, STOP_GRACE_S)
        deadline = time.monotonic() + grace
        settled_at = time.monotonic() + INTERRUPT_SETTLE_S
        severed: set[int] = set()
        try:
            self.interrupt(pending())
            # no second SIGINT: one landing while a rank sends its reply would lose the reply
            while not all(c.wait(POLL_S / len(calls)) for c in calls):
                if time.monotonic() > deadline:
                    self.mark_broken(
                        f"ranks {pending()} did not stop within {grace:g} s of the interrupt; call restart()"
                    )
                    return
                if time.monotonic() >= settled_at:
                    answered = set(range(self.n)) - set(pending()) - severed
                    self.sever_group(sorted(answered), grace)
                    severed |= answered
            for c in calls:
                for r in c.ranks:
                    self._last_call[r] = c
            self._repair_group(severed=bool(severed))
        except KeyboardInterrupt:
            self.mark_broken("interrupted again while stopping the ranks; call restart()")
            raise

    def sever_group(self, ranks: Sequence[int], grace: float) -> None:
        """Make ``ranks`` shut their group connections.

        Any collective another rank waits in with them then fails at once.

        Parameters
        ----------
        ranks : sequence of int
            Idle, live ranks.
        grace : float
            Seconds to wait for them to do it.
        """
        if ranks:
            self._view_on(list(ranks)).apply_async(engine.sever_group).get(grace)

    def _repair_group(self, severed: bool = False) -> None:
        """Form the group again unless every rank is in it having started the same number of
        collectives (so none was left inside one)."""
        try:
            states = self._view_on(list(range(self.n))).apply_async(engine.group_state).get(self.timeout)
            if severed or len(set(states)) > 1 or not all(in_group for in_group, _ in states):
                self._form_group()
        except Exception as exc:
            self.mark_broken(f"the group could not be formed again after a failure ({exc}); call restart()")

    def _require_usable(self, ranks: Sequence[int]) -> None:
        if self.state == ClusterState.BROKEN:
            dead = self.dead_ranks(range(self.n))
            if dead:
                raise RankDiedError(dead)
            raise RuntimeError(f"cluster needs restart(): {self.broken_reason}")
        if self.state != ClusterState.RUNNING:
            raise RuntimeError(f"cluster is {self.state}; call start() first")
        self.check_alive(ranks)
