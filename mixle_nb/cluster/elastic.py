"""Elastic recovery: a rank dies mid-fit and the fit goes on, exactly, on the survivors.

The survivors of the failed call are let finish (their collective with the dead rank fails at
once, its connections gone); they form a new group among themselves (:meth:`MixleCluster.drop_ranks`);
every survivor's elastic handle reads the dead rank's logical shards again from the files
(:meth:`TorchRunEncodedData.rejoin`), and the step is taken again, computing only those shards
(the survivors kept their own shards' statistics). Folded in shard order, the statistics — and so
the model — are bit for bit those of a run without the failure. A rank that dies during the
recovery is dropped too, until no rank is left.

Streaming training takes the same path: each survivor's handle maps its new slice of the token
file (:meth:`StreamingTokenEncodedData.rejoin`) and the next training call resumes from the
newest complete checkpoint (``RecoveryEvent.resumed_from``); that run is within noise of the
failure-free one, not bit for bit.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from . import rank_side, step_calls
from .calls import RankCall, RankDiedError, RankError

SURVIVORS_SETTLE_S = 10.0  # how long the survivors of a failed call may take to fail with it


class ElasticRecoveryError(RuntimeError):
    """The survivors could not take over the lost ranks' shards; ``cluster.restart()`` is left."""


@dataclass
class RecoveryEvent:
    """One recovery: the ranks lost (each loss in the numbering of the group it left), at
    which step, what each survivor read again, how long it took, and the world after."""

    lost: list
    at_step: int
    seconds: float
    world: int
    read: list = field(default_factory=list)  # per new rank: the shards it read from the files
    resumed_from: int | None = None  # streaming training: the checkpoint's step it went on from

    def describe(self) -> str:
        lost = " then ".join(f"rank {', '.join(map(str, ranks))}" for ranks in self.lost)
        if self.resumed_from is not None:
            return (
                f"{lost} died at step {self.at_step}: the {self.world} surviving rank"
                f"{'s' if self.world > 1 else ''} resumed from the checkpoint of step "
                f"{self.resumed_from} ({self.seconds:.2f} s)"
            )
        moved = sum(len(r) for r in self.read)
        return (
            f"{lost} died at step {self.at_step}: the {self.world} surviving rank"
            f"{'s' if self.world > 1 else ''} read its {moved} shard{'s' if moved != 1 else ''} again and "
            f"went on ({self.seconds:.2f} s)"
        )


class RecoveringCluster(Protocol):
    """What recovery asks of a cluster (:class:`~mixle_nb.cluster.MixleCluster` has it all)."""

    n: int

    def dead_ranks(self, ranks: Iterable[int]) -> list[int]: ...

    def sever_group(self, ranks: Sequence[int], grace: float) -> None: ...

    def interrupt(self, ranks: Sequence[int]) -> None: ...

    def drop_ranks(self, dead: Sequence[int]) -> None: ...

    def run_async(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> RankCall: ...

    def run(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> list[Any]: ...


def settle_survivors(cluster: RecoveringCluster, calls: Sequence[RankCall], dead: Sequence[int]) -> list[int]:
    """Wait until every rank of ``calls`` but the dead has answered; the dead ranks, sorted:
    ``dead`` and any found dead meanwhile (a second death can reach the client with the first:
    a survivor that finished the step the first cut may die in the next). A survivor in a
    collective with a dead rank fails at once, its connection gone; one waiting on another
    survivor (a ring) fails when that survivor, once it answered, shuts its connections down
    (as ``stop_call`` does). Those still running after :data:`SURVIVORS_SETTLE_S` are
    interrupted."""
    found = set(dead)
    severed: set[int] = set()
    for call in calls:
        deadline = time.monotonic() + SURVIVORS_SETTLE_S
        interrupted = False
        while True:
            found.update(cluster.dead_ranks([r for r in call.ranks if r not in found]))
            running = [r for r in call.pending() if r not in found]
            if not running:
                break
            answered = sorted(set(call.ranks) - set(call.pending()) - severed - found)
            if answered:
                try:
                    cluster.sever_group(answered, SURVIVORS_SETTLE_S)
                    severed.update(answered)
                except Exception:  # one of them died since the check: found on the next pass
                    pass
            if time.monotonic() > deadline:
                if interrupted:
                    raise ElasticRecoveryError(
                        f"ranks {running} did not stop after ranks {sorted(found)} died; call cluster.restart()"
                    )
                cluster.interrupt(running)
                deadline, interrupted = time.monotonic() + SURVIVORS_SETTLE_S, True
            time.sleep(0.01)
    return sorted(found)


def recover(
    cluster: RecoveringCluster, handle: str, dead: Sequence[int], calls: Sequence[RankCall] = (), at_step: int = 0
) -> RecoveryEvent:
    """Go on without the ranks ``dead`` after ``calls`` (sent before the loss) failed: the
    survivors form a new group and the elastic handle named ``handle`` on them takes over
    the lost shards. Survives further losses while it runs; raises
    :class:`ElasticRecoveryError` when no rank is left or the handle cannot go on."""
    started = time.perf_counter()
    lost = [settle_survivors(cluster, calls, dead)]
    while True:
        try:
            cluster.drop_ranks(lost[-1])
            call = cluster.run_async(rank_side.rejoin_on_rank, handle)
        except RankDiedError as exc:  # a survivor died before the new group formed
            if len(exc.ranks) >= cluster.n:
                raise ElasticRecoveryError(f"every rank died ({exc}); call cluster.restart()") from exc
            lost.append(exc.ranks)
            continue
        try:
            read = call.result()
        except RankDiedError as exc:  # a survivor died while the others read its shards
            lost.append(settle_survivors(cluster, [call], exc.ranks))
            continue
        except RankError as exc:
            raise ElasticRecoveryError(
                f"the survivors could not take over the shards of ranks {lost}: {exc}; call cluster.restart()"
            ) from exc
        return RecoveryEvent(lost, at_step, time.perf_counter() - started, cluster.n, read)


def completed_on_survivors(cluster: RecoveringCluster, call_ids: Sequence[str]) -> list[Any]:
    """The steps the failed calls ``call_ids`` completed, from the survivor that completed the
    most (a survivor can finish a step whose fold another one lost; every survivor's steps are
    the same, bit for bit, as far as each got): one record per step, in order."""
    steps: list[Any] = []
    for call_id in call_ids:
        per_rank = cluster.run(step_calls.completed_steps_on_rank, call_id)
        longest = max(per_rank, key=len)
        steps += longest
        if any(len(s) < len(longest) for s in per_rank) or not longest:
            break  # the calls after the one the loss cut ran no step
    return steps
