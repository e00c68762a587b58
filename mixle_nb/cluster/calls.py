"""Calls running on the ranks, and the errors they raise.

A :class:`RankCall` wraps ipyparallel's ``AsyncResult``. It never blocks on the engines: it waits
in short slices and between them asks its :class:`Supervisor` (the cluster) whether the ranks
are alive, so a rank killed mid-call surfaces as :class:`RankDiedError` within a slice. When one
rank has failed and the others are still running (waiting in a collective for it, typically),
or when the client is interrupted, the supervisor stops the rest, so a call fails together.
"""

from __future__ import annotations

import asyncio
import re
import threading
import time
from collections.abc import Callable, Generator, Sequence
from typing import Any, Protocol

POLL_S = 0.05  # client wait slice: bounds how late a dead rank is noticed
AWAIT_SLICE_S = 0.1  # how often a worker waiting on the ranks checks for an interrupt
FAIL_SETTLE_S = 0.5  # after one rank failed, how long the others may take to fail on their own
_ANSI = re.compile(r"\x1b\[[0-9;]*m")

# Errors that follow from another rank's failure rather than causing one: the handles' own
# peer-failure error (mixle_nb.parallel.fail_together.PeerRankError, named here so the client
# needs no torch), an interrupt the cluster sent after a failure, and a collective that timed out
# or lost its peer (gloo's messages), which also means the group must be formed again.
_CONSEQUENCE_NAMES = {"PeerRankError", "KeyboardInterrupt"}
_COLLECTIVE_BROKEN = re.compile(
    r"Timed out waiting|Connection closed by peer|Connection reset by peer"
    r"|Broken pipe",
    re.IGNORECASE,
)


def collective_broken(evalue: str) -> bool:
    """Whether a rank's error says its collective timed out or lost a peer."""
    return bool(_COLLECTIVE_BROKEN.search(evalue or ""))


def is_consequence(ename: str, evalue: str) -> bool:
    """Whether a rank's error follows from another rank's failure rather than causing one."""
    return ename in _CONSEQUENCE_NAMES or collective_broken(evalue)


class RankError(RuntimeError):
    """An exception raised on the ranks, named by its root cause.

    ``rank``/``ename``/``evalue``/``traceback_text`` describe the *primary* failure: the first
    rank whose error is not a consequence of another's (a collective timeout, a lost peer, a
    peer-failure error). ``errors`` lists ``(rank, ename, evalue)`` for every rank that failed.

    Parameters
    ----------
    rank : int
        The rank of the primary failure.
    ename : str
        The name of its exception class.
    evalue : str
        Its message.
    traceback_text : str
        Its remote traceback, without terminal colour codes.
    errors : sequence of (int, str, str), optional
        ``(rank, ename, evalue)`` of every rank that failed (default: the primary one alone).

    See Also
    --------
    RankDiedError : A rank's engine died instead of raising.

    Examples
    --------
    >>> from mixle_nb.cluster import RankError
    >>> error = RankError(
    ...     1, "ValueError", "x has NaN", "Traceback ...",
    ...     [(0, "PeerRankError", "rank 1 failed"), (1, "ValueError", "x has NaN")],
    ... )
    >>> print(error)
    rank 1 raised ValueError: x has NaN
      rank 0 then raised PeerRankError: rank 1 failed
    --- remote traceback (rank 1) ---
    Traceback ...
    """

    def __init__(
        self, rank: int, ename: str, evalue: str, traceback_text: str, errors: Sequence[tuple[int, str, str]] = ()
    ):
        self.rank, self.ename, self.evalue = rank, ename, evalue
        self.traceback_text = traceback_text
        self.errors = sorted(errors) or [(rank, ename, evalue)]
        others = [f"\n  rank {r} then raised {n}: {_first_line(v)}" for r, n, v in self.errors if r != rank]
        super().__init__(
            f"rank {rank} raised {ename}: {evalue}{''.join(others)}\n"
            f"--- remote traceback (rank {rank}) ---\n{traceback_text}"
        )

    @classmethod
    def from_failures(cls, failures: Sequence[tuple[int, Any]]) -> RankError:
        """The error for the ranks' failures, named by the root cause.

        Parameters
        ----------
        failures : sequence of (int, ipyparallel.error.RemoteError)
            Each failed rank and its error.

        Returns
        -------
        RankError
            The primary failure is the lowest rank whose error is not a consequence of another
            rank's failure (else the lowest rank); ``errors`` lists them all.
        """
        causes = [(r, e) for r, e in failures if not is_consequence(e.ename, e.evalue)]
        rank, primary = (causes or sorted(failures, key=lambda f: f[0]))[0]
        return cls(
            rank,
            primary.ename,
            primary.evalue,
            _plain_traceback(primary.traceback),
            [(r, e.ename, e.evalue) for r, e in failures],
        )


class RankDiedError(RuntimeError):
    """One or more ranks' engines died; the group is broken until ``restart()``.

    Parameters
    ----------
    ranks : sequence of int
        The ranks that died (kept sorted in ``ranks``).
    detail : str, optional
        Appended to the message after "died" (e.g. how contact was lost).

    See Also
    --------
    RankError : A rank raised instead.

    Examples
    --------
    >>> from mixle_nb.cluster import RankDiedError
    >>> print(RankDiedError([3, 1]))
    ranks 1, 3 died; the torch.distributed group is broken: call cluster.restart()
    """

    def __init__(self, ranks: Sequence[int], detail: str = ""):
        self.ranks = sorted(ranks)
        which = ", ".join(str(r) for r in self.ranks)
        super().__init__(
            f"rank{'s' if len(self.ranks) > 1 else ''} {which} died{detail}; the "
            "torch.distributed group is broken: call cluster.restart()"
        )


class Supervisor(Protocol):
    """What a :class:`RankCall` asks of its cluster; nothing else of the cluster is touched."""

    def check_alive(self, ranks: Sequence[int]) -> None:
        """Raise :class:`RankDiedError` (and mark the cluster broken) if a rank died."""

    def ranks_died(self, ranks: Sequence[int]) -> RankDiedError:
        """Mark the cluster broken by the death of ``ranks``; the error to raise."""

    def stop_call(self, call: RankCall, queued: Sequence[RankCall] = ()) -> None:
        """Stop every rank still running ``call`` (and the calls ``queued`` behind it) and leave
        the group usable; where a rank does not stop, mark the cluster broken (``call`` then
        still has pending ranks)."""

    def call_finished(self, call: RankCall) -> None:
        """``call`` has every rank's answer (for the status table's timings)."""


class RankCall:
    """A call running on some ranks: awaitable, pollable, interruptible.

    It wraps ipyparallel's ``AsyncResult`` and never blocks on the engines: it waits in short
    slices and between them asks its supervisor (the cluster) whether the ranks are alive, so a
    rank killed mid-call surfaces as :class:`RankDiedError` within a slice. ``data`` maps rank ->
    the latest dict that rank published with ``ipyparallel.datapub.publish_data`` while the call
    runs. :meth:`MixleCluster.run_async` and :meth:`MixleCluster.execute_async` make them.

    Parameters
    ----------
    supervisor : MixleCluster
        The cluster the call runs on (what it asks about liveness and stopping).
    ranks : list of int
        The ranks running the call.
    async_result : ipyparallel.AsyncResult
        ipyparallel's handle on the call.

    Examples
    --------
    A call needs a running cluster, which these skipped lines would start:

    >>> import os
    >>> from mixle_nb.cluster import MixleCluster
    >>> cluster = MixleCluster(2).start()  # doctest: +SKIP
    >>> call = cluster.run_async(os.getpid)  # doctest: +SKIP
    >>> len(call.result(timeout=30))  # doctest: +SKIP
    2
    >>> call.done(), call.pending()  # doctest: +SKIP
    (True, [])
    """

    def __init__(self, supervisor: Supervisor, ranks: list[int], async_result: Any) -> None:
        self.supervisor, self.ranks, self._ar = supervisor, ranks, async_result
        self._cancelled = self._stopped = False
        self._first_failure_at: float | None = None

    def done(self) -> bool:
        """Whether every rank has answered.

        Returns
        -------
        bool
            True once every rank has answered.
        """
        return self._ar.ready()

    def wait(self, timeout: float) -> bool:
        """Wait for every rank's answer.

        Parameters
        ----------
        timeout : float
            The most seconds to wait.

        Returns
        -------
        bool
            Whether they all answered.
        """
        return self._ar.wait(timeout)

    def wait_for_output(self, timeout: float) -> bool:
        """Wait for every rank's printed output, which may trail its answer.

        Parameters
        ----------
        timeout : float
            The most seconds to wait.

        Returns
        -------
        bool
            Whether all the output arrived.
        """
        return self._ar.wait_for_output(timeout)

    def ranks_done(self) -> list[int]:
        """The ranks that have answered, successfully or not.

        Returns
        -------
        list of int
            Those ranks, in the call's order.
        """
        return [r for r, t in zip(self.ranks, self._ar["completed"]) if t is not None]

    def pending(self) -> list[int]:
        """The ranks still running the call.

        Returns
        -------
        list of int
            Those ranks, sorted.
        """
        return sorted(set(self.ranks) - set(self.ranks_done()))

    def failed_ranks(self) -> list[int]:
        """The ranks that have answered with an error so far.

        Returns
        -------
        list of int
            Those ranks, in the call's order.
        """
        return [r for r, s in zip(self.ranks, self._ar["status"]) if s == "error"]

    def outcomes(self) -> list[Any]:
        """Each rank's result or ipyparallel ``RemoteError``; every rank must be done.

        Returns
        -------
        list
            One outcome per rank, in the call's order.
        """
        results = self._ar.get(0, return_exceptions=True)
        return results if isinstance(results, list) else [results]

    def rank_seconds(self, rank: int) -> float | None:
        """How long ``rank`` ran the call, from the engine's timestamps.

        Parameters
        ----------
        rank : int
            One of the call's ranks.

        Returns
        -------
        float or None
            Seconds, or ``None`` until the rank answered.
        """
        i = self.ranks.index(rank)
        t0, t1 = self._ar["started"][i], self._ar["completed"][i]
        return None if t0 is None or t1 is None else (t1 - t0).total_seconds()

    @property
    def data(self) -> dict[int, dict[str, Any]]:
        """rank -> the latest dict that rank published while the call runs."""
        return {r: d for r, d in zip(self.ranks, self._ar["data"]) if d}

    @property
    def stdout(self) -> dict[int, str]:
        """rank -> everything the rank has printed in this call so far."""
        return dict(zip(self.ranks, self._ar["stdout"]))

    @property
    def stderr(self) -> dict[int, str]:
        """rank -> everything the rank has written to stderr (warnings) in this call so far."""
        return dict(zip(self.ranks, self._ar["stderr"]))

    def cancelled(self) -> bool:
        """Whether :meth:`cancel` was called (or the client was interrupted while waiting).

        Returns
        -------
        bool
            True once cancelled.
        """
        return self._cancelled

    def stopped(self) -> bool:
        """Whether the cluster stopped this call's ranks (cancelled, or after a rank failed).

        Returns
        -------
        bool
            True once stopped.
        """
        return self._stopped

    def cancel(self, queued: Sequence[RankCall] = ()) -> None:
        """Stop every rank still running this call, and the calls queued behind it.

        The ranks get a ``KeyboardInterrupt``. Calls ``queued`` behind this one are stopped with it,
        since an interrupt may leave them running on some ranks only; the group stays usable, or the
        cluster says why it needs ``restart()``.

        Parameters
        ----------
        queued : sequence of RankCall, optional
            Calls sent after this one that must not run on alone.
        """
        self._cancelled = True
        for later in queued:
            later._cancelled = later._stopped = True
        self._stop(queued)

    def _stop(self, queued: Sequence[RankCall] = ()) -> None:
        self._stopped = True
        self.supervisor.stop_call(self, queued)

    def result(self, timeout: float | None = None) -> list[Any]:
        """Wait for every rank's answer.

        A KeyboardInterrupt while waiting stops every rank of the call, then re-raises.

        Parameters
        ----------
        timeout : float, optional
            Seconds to wait; no limit if None.

        Returns
        -------
        list
            Each rank's result, in the order of ``ranks``.

        Raises
        ------
        RankError
            The call raised on some rank (named by its root cause).
        RankDiedError
            A rank died before answering; the cluster is broken until ``restart()``.
        TimeoutError
            Some ranks still run after ``timeout`` (the call goes on).
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            while not self._ar.wait(POLL_S):
                self._supervise()
                if deadline is not None and time.monotonic() >= deadline:
                    raise TimeoutError(f"ranks {self.pending()} still running after {timeout} s")
        except KeyboardInterrupt:
            self.cancel()
            raise
        return self._collect()

    def __await__(self) -> Generator[Any, None, list[Any]]:
        return self._wait_async().__await__()

    async def _wait_async(self) -> list[Any]:
        while not self._ar.ready():
            self._supervise()
            await asyncio.sleep(POLL_S)
        return self._collect()

    def _supervise(self) -> None:
        """Between wait slices: raise if a rank died; stop the rest once a rank has failed."""
        self.supervisor.check_alive(self.ranks)
        if self._first_failure_at is None:
            if self.failed_ranks():
                self._first_failure_at = time.monotonic()
        elif time.monotonic() - self._first_failure_at > FAIL_SETTLE_S:
            self._stop()
            if not self.done():
                raise RuntimeError(
                    f"ranks {self.failed_ranks()} failed and ranks {self.pending()} "
                    "did not stop; the cluster needs restart()"
                )

    def _collect(self) -> list[Any]:
        from ipyparallel.error import RemoteError

        results = self.outcomes()
        self.supervisor.call_finished(self)
        failed = [(r, e) for r, e in zip(self.ranks, results) if isinstance(e, RemoteError)]
        if not failed:
            return results
        dead = [r for r, e in failed if e.ename == "EngineError"]
        if dead:
            raise self.supervisor.ranks_died(dead)
        raise RankError.from_failures(failed)


def result_unless_interrupted(
    call: Any, interrupted: threading.Event, on_slice: Callable[[], None] = lambda: None, queued: Sequence = ()
) -> list:
    """The per-rank results of ``call`` (a :class:`RankCall`, or a local one), waited for in
    slices: between them ``on_slice`` runs, and once ``interrupted`` is set the call is cancelled
    on every rank with the calls ``queued`` behind it (its result then raises)."""
    while True:
        try:
            return call.result(timeout=AWAIT_SLICE_S)
        except TimeoutError:
            on_slice()
            if interrupted.is_set() and not call.cancelled():
                call.cancel(queued)


def _first_line(text: str) -> str:
    return (text or "").strip().splitlines()[0] if (text or "").strip() else ""


def _plain_traceback(traceback: str | Sequence[str]) -> str:
    """The engine's traceback (a string or a list of lines) without terminal colour codes."""
    text = traceback if isinstance(traceback, str) else "\n".join(traceback or ())
    return _ANSI.sub("", text)
