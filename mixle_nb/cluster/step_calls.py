"""Calls of several EM steps on the ranks, pipelined: the engine half (:func:`em_steps_on_rank`,
:func:`completed_steps_on_rank`) and the client half (:class:`StepCalls`), which sends a call
of about ``batch_seconds`` with the next one queued behind it, so the ranks go from call to
call without waiting on the client's round trip, and fetches what a failed call completed.

Engines import this module: it imports neither ipywidgets nor matplotlib."""

from __future__ import annotations

import collections
import copy
import itertools
import pickle
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from . import rank_side
from .calls import result_unless_interrupted

BATCH_SECONDS = 0.2  # a run's call of several steps lasts about this long: a panel redraws at
# most 5 times a second anyway, and Pause waits for at most two calls. With a call queued behind
# the running one the round trip is hidden; 0.5 s calls measured no faster (1.04x against 1.09x)
BATCH_GROWTH = 4  # a call at most 4x the steps of the last: one fast measurement cannot make a long call

# -- the engine half ------------------------------------------------------------------------

# The steps of the last two em_steps_on_rank calls on this rank, by call id, and whether each
# finished: a call failing (or interrupted) mid-batch loses nothing, since the client fetches
# its completed steps afterwards, and the call sent behind it knows not to start.
_calls: dict = {}
CALLS_KEPT = 2


def em_steps_on_rank(
    handle: str, estimator: str, model: str, n_steps: int, call_id: str, after: str | None = None
) -> list:
    """``n_steps`` EM steps in one call, each recorded as :func:`~.rank_side.em_step_on_rank`
    does; the batch size is fixed by the client, so every rank runs the same collectives and no
    rank's clock decides when to stop. Each completed step is kept for :func:`completed_steps_on_rank`.

    ``after`` is the call sent just before this one: the client sends a call before the last
    one returns, so the ranks never wait on it. If that call did not finish here (it failed or
    was interrupted, which happens on every rank together), this one runs no step."""
    if after is not None and not _calls.get(after, {}).get("finished", False):
        return []
    steps: list = []
    _calls[call_id] = {"steps": steps, "finished": False}
    for old in list(_calls)[:-CALLS_KEPT]:
        del _calls[old]
    for _ in range(n_steps):
        record = rank_side.em_step_on_rank(handle, estimator, model)
        record.model = snapshot(record.model)
        steps.append(record)
    _calls[call_id]["finished"] = True
    return steps


def snapshot(model: Any) -> Any:
    """The model as a step keeps it: the live one stays bound on the rank and holds what its
    next E-step prepares (torch tensors), and keeping every step's live model made the E-steps
    ~30% slower. Ours: a shallow copy, which takes the state a pickle takes (their
    ``__getstate__`` drops the prepared kernel) and shares the parameters, which EM never
    changes in place (3 µs, where a pickle round trip took 75-160 µs, a sixth of a step at
    N = 1,000). Another package's (mixle's): a pickle round trip, which keeps nothing shared."""
    from ..stats.base import Distribution  # here: an engine imports this module before it steps

    if isinstance(model, Distribution):
        return copy.copy(model)
    return pickle.loads(pickle.dumps(model))


def completed_steps_on_rank(call_id: str) -> list:
    """The steps call ``call_id`` of :func:`em_steps_on_rank` completed here (all of them if it
    finished; those before the failing step if it raised or was interrupted)."""
    return list(_calls.get(call_id, {}).get("steps", []))


# -- the client half ------------------------------------------------------------------------


@dataclass
class SentCall:
    """A call of ``steps`` EM steps sent to the ranks under ``call_id``."""

    call: Any
    call_id: str
    steps: int


class StepCalls:
    """The client half, for the handle, estimator and model named on ``ranks`` (a cluster, or a
    :class:`~.local_ranks.LocalRanks`, whose calls run as they are sent). :meth:`fill` sends calls
    sized from the measured step time to last about ``batch_seconds`` (0: one step a call, none
    queued, so a pause stops within a step), keeping one queued behind the running one;
    :meth:`collect` waits for the oldest, which ``interrupted`` cancels on every rank with the
    calls queued behind it; :meth:`completed` fetches the steps a failed call completed."""

    def __init__(
        self, ranks: Any, handle: str, estimator: str, model: str, batch_seconds: float, interrupted: threading.Event
    ):
        self.ranks, self.handle, self.estimator, self.model = ranks, handle, estimator, model
        self.batch_seconds, self.interrupted = batch_seconds, interrupted
        self.sent = 0  # calls sent
        self.step_s: float | None = None  # the slowest rank's seconds a step, once measured
        self.queue: collections.deque[SentCall] = collections.deque()  # sent, not collected
        self.failed: list[SentCall] = []  # the call that failed last, then those queued behind it
        self._last_steps = 0
        # call ids: one random prefix a client, then a count (uuid4 a call read the OS's random
        # source each step); ranks keep calls of several clients apart by the prefix
        prefix = uuid.uuid4().hex
        self._call_ids = (f"{prefix}-{n}" for n in itertools.count())

    def next_batch(self) -> int:
        """Steps in the next call: one until the step time is measured, then about
        ``batch_seconds`` of it, at most ``BATCH_GROWTH`` times the last call's."""
        if self.step_s is None or self.batch_seconds == 0:
            return 1
        return max(1, min(BATCH_GROWTH * self._last_steps, int(self.batch_seconds / self.step_s)))

    def send(self, n: int) -> SentCall:
        """Start ``n`` steps on the ranks, behind the newest call queued (if that one does not
        finish, this one runs no step)."""
        after = self.queue[-1].call_id if self.queue else None
        call_id = next(self._call_ids)
        self.failed = []
        self.sent += 1
        self._last_steps = n
        call = self.ranks.run_async(em_steps_on_rank, self.handle, self.estimator, self.model, n, call_id, after)
        self.queue.append(SentCall(call, call_id, n))
        return self.queue[-1]

    def fill(self, left: int, paused: Callable[[], bool]) -> int:
        """Send calls of up to ``left`` steps in all until one is queued behind the running one
        (once the step time is measured, and not at one step a call) or ``paused()``; the steps sent."""
        depth = 1 if self.step_s is None or self.batch_seconds == 0 else 2
        sent = 0
        while len(self.queue) < depth and sent < left and not paused():
            sent += self.send(min(self.next_batch(), left - sent)).steps
        return sent

    def collect(self) -> list:
        """The steps of the oldest call sent (:func:`merged`), which measure the step time. If it fails,
        the calls queued behind it are awaited (they run no step), :attr:`failed` holds it and
        them, and its error is raised."""
        sent = self.queue.popleft()
        try:
            per_rank = result_unless_interrupted(sent.call, self.interrupted, queued=[q.call for q in self.queue])
        except BaseException:
            self.failed = [sent, *self.queue]
            self.queue.clear()
            for later in self.failed[1:]:
                try:
                    result_unless_interrupted(later.call, self.interrupted)
                except BaseException:
                    pass
            raise
        if all(per_rank):
            self.step_s = max(sum(s.step_s for s in steps) for steps in per_rank) / sent.steps
        return merged(per_rank)

    def completed(self) -> list:
        """The steps the failed call completed (:func:`merged`; the ranks keep them); none when a
        rank cannot answer (a dead rank took them with it)."""
        try:
            return merged(self.ranks.run(completed_steps_on_rank, self.failed[0].call_id))
        except Exception:
            return []

    def abandon(self) -> list[SentCall]:
        """The failed calls and those still queued, forgotten here (elastic recovery settles them)."""
        calls = [*self.failed, *self.queue]
        self.failed, self.queue = [], collections.deque()
        return calls


def merged(per_rank: list) -> list:
    """The steps every rank completed (a rank interrupted just after a step may have one more
    than the others): rank 0's records, each with every rank's E-step seconds."""
    if len(per_rank) == 1:  # one rank (a local panel's): its records already carry its seconds
        return list(per_rank[0])
    completed = min(len(steps) for steps in per_rank)
    return [
        replace(per_rank[0][i], rank_seconds=[steps[i].rank_seconds[0] for steps in per_rank]) for i in range(completed)
    ]
