"""The collectives a handle makes among the ranks of its group, and the status it sends in them.

Every operation of a handle carries its status in an exchange it makes anyway (fail together,
``fail_together.py``): a :class:`Header` names the float64 fields at the front of that vector —
a failed word, the slots that check every rank holds the same text, counts — so the code packs
and reads fields by name, never by index. :class:`RankExchange` holds the group, the root and
the device the collectives run on, with the sums, rows and gathers built on them and the
failure path every rank settles together.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, NoReturn

import numpy as np
import torch
import torch.distributed as dist

from .fail_together import agreed, agreement_slots, failure_message, odd_ones_out, raise_failures
from .group import GroupMembership

EXCHANGE_MAX_FLOATS = 1 << 18  # world × vector length; above it sums use all_reduce, rows all_gather
POLL_S = 0.005  # how long a small exchange polls before it blocks
AGREEMENT_WIDTH = 3  # agreement_slots' length


class Header:
    """Named float64 fields at the front of an exchanged vector, each of a fixed width.

    ``Header(failed=1, agreement=AGREEMENT_WIDTH, count=1)`` packs ``pack(failed=..., ...)`` (a
    field left out is zeros) and reads a vector, summed over the ranks or one rank's row, back
    by name: a field of width 1 as a float, wider ones as arrays."""

    def __init__(self, **widths: int):
        self._slices, start = {}, 0
        for name, width in widths.items():
            self._slices[name] = slice(start, start + width)
            start += width
        self.width = start

    def pack(self, **values: Any) -> np.ndarray:
        unknown = set(values) - set(self._slices)
        if unknown:
            raise KeyError(f"internal: no header field {sorted(unknown)}")
        out = np.zeros(self.width)
        for name, value in values.items():
            out[self._slices[name]] = value
        return out

    def read(self, vector: Any) -> SimpleNamespace:
        vector = np.asarray(vector, dtype=np.float64)
        return SimpleNamespace(
            **{name: float(vector[s.start]) if s.stop - s.start == 1 else vector[s] for name, s in self._slices.items()}
        )


STATUS = {"failed": 1, "agreement": AGREEMENT_WIDTH}  # the fields status() fills, to build headers with


def status(error: BaseException | None, text: str | None, world: int) -> dict:
    """The ``failed`` and ``agreement`` fields of a rank's status: whether it failed, and the
    slots that tell whether every rank sent the same ``text`` (``None``: nothing to compare)."""
    return {"failed": float(error is not None), "agreement": agreement_slots(text, world)}


def all_well(summed: SimpleNamespace) -> bool:
    """From the summed ``failed`` and ``agreement`` fields: no rank failed and all agreed."""
    return summed.failed == 0 and agreed(summed.agreement)


@dataclass(frozen=True)
class StatusCheck:
    """What an operation's status exchange checks, and what every rank is told when it fails:
    ``operation`` names it in errors; ``mine`` is this rank's text that every rank must share
    (``None``: nothing to compare), ``what`` says what that text describes, ``fix`` what to do
    when a rank's differs (``{rank}`` becomes the rank at fault)."""

    operation: str
    mine: str | None = None
    what: str = ""
    fix: str = ""


def finish(work: Any) -> None:
    """Wait for an async collective: poll for up to ``POLL_S``, yielding the core, then block.
    Waking a thread blocked in gloo costs about a millisecond on a busy machine, more than a
    small exchange itself; the poll is bounded so a long wait for a slower rank burns no CPU."""
    deadline = time.perf_counter() + POLL_S
    while not work.is_completed() and time.perf_counter() < deadline:
        os.sched_yield()
    work.wait()


class RankExchange:
    """The collectives among the ranks of one group membership, on the backend's device (nccl:
    CUDA), with ``root`` the rank that gathers and broadcasts. ``sent(phase)`` is told once this
    rank's part of a :meth:`rows` exchange is on its way (fault-injection tests)."""

    def __init__(
        self, membership: GroupMembership, root: int = 0, sent: Callable[[str | None], None] = lambda phase: None
    ):
        self.membership, self.group = membership, membership.group
        self.rank, self.world, self.device = membership.rank, membership.world, membership.device
        self.root, self.global_root = root, membership.global_rank(root)
        self._sent = sent

    def sum(self, numbers: Any) -> np.ndarray:
        """Element-wise sum of a float64 vector over the ranks, bit-identical on every rank.

        Small vectors take one ``all_to_all`` exchange, after which each rank adds the
        world's vectors in rank order: one round of messages against the ring all-reduce's
        2·(world - 1), which is what a per-step fold of a few statistics waits on. Vectors
        whose exchange would move over ``EXCHANGE_MAX_FLOATS`` take ``all_reduce``."""
        if self.world == 1:
            return np.array(numbers, dtype=np.float64)
        local = torch.as_tensor(np.asarray(numbers, dtype=np.float64), device=self.device)
        if local.numel() * self.world > EXCHANGE_MAX_FLOATS:
            dist.all_reduce(local, group=self.group)
            return local.cpu().numpy()
        received = torch.empty(self.world, local.numel(), dtype=local.dtype, device=self.device)
        finish(dist.all_to_all_single(received, local.repeat(self.world), group=self.group, async_op=True))
        total = received[0].clone()
        for row in received[1:]:
            total += row
        return total.cpu().numpy()

    def rows(self, numbers: Any, phase: str | None = None) -> np.ndarray:
        """Every rank's float64 vector, as rows in rank order, on every rank. Small vectors take
        one ``all_to_all`` (every pair of ranks connected: a dead rank fails every peer at
        once), larger ones ``all_gather``."""
        local = np.asarray(numbers, dtype=np.float64)
        if self.world == 1:
            self._sent(phase)
            return local[None]
        tensor = torch.as_tensor(local, device=self.device)
        if tensor.numel() * self.world > EXCHANGE_MAX_FLOATS:
            rows = [torch.empty_like(tensor) for _ in range(self.world)]
            work = dist.all_gather(rows, tensor, group=self.group, async_op=True)
            self._sent(phase)
            work.wait()
            return torch.stack(rows).cpu().numpy()
        received = torch.empty(self.world, tensor.numel(), dtype=tensor.dtype, device=self.device)
        work = dist.all_to_all_single(received, tensor.repeat(self.world), group=self.group, async_op=True)
        self._sent(phase)
        finish(work)
        return received.cpu().numpy()

    def gather(self, obj: Any) -> list:
        """Every rank's ``obj`` (picklable) in rank order, on every rank."""
        if self.world == 1:
            return [obj]
        out = [None] * self.world
        dist.all_gather_object(out, obj, group=self.group)
        return out

    def gather_to_root(self, obj: Any, phase: str | None = None) -> list | None:
        """Every rank's ``obj`` in rank order on the root; ``None`` elsewhere."""
        self._sent(phase)
        if self.world == 1:
            return [obj]
        parts = [None] * self.world if self.rank == self.root else None
        dist.gather_object(obj, parts, dst=self.global_root, group=self.group)
        return parts

    def broadcast(self, obj: Any) -> Any:
        """The root's ``obj`` on every rank."""
        if self.world == 1:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=self.global_root, group=self.group)
        return box[0]

    def scatter(self, items: list | None) -> Any:
        """The root's ``items[r]`` on rank ``r`` (``None`` everywhere when the root has none)."""
        if self.world == 1:
            return None if items is None else items[0]
        received = [None]
        sent = items if items is not None or self.rank != self.root else [None] * self.world
        dist.scatter_object_list(
            received, sent if self.rank == self.root else None, src=self.global_root, group=self.group
        )
        return received[0]

    def checked_sum(
        self, header: Header, check: StatusCheck, error: BaseException | None, **fields: Any
    ) -> SimpleNamespace:
        """Sum ``header``'s fields over the ranks, with this rank's status (``error``, and the
        text ``check.mine`` every rank must share) in the same vector: the one exchange an
        operation makes, carrying its fail-together word. Returns the summed fields when every
        rank is well and agrees; otherwise every rank raises together (:meth:`settle`)."""
        summed = header.read(self.sum(header.pack(**status(error, check.mine, self.world), **fields)))
        if not all_well(summed):
            self.settle(check, error)
        return summed

    def checked_rows(
        self,
        header: Header,
        check: StatusCheck,
        error: BaseException | None,
        body: Any = (),
        phase: str | None = None,
        **fields: Any,
    ) -> tuple[SimpleNamespace, np.ndarray]:
        """:meth:`rows` of ``header``'s fields followed by ``body``, with this rank's status in
        the header: returns (the header summed over the ranks, every rank's row) when every rank
        is well and agrees; otherwise every rank raises together (:meth:`settle`)."""
        head = header.pack(**status(error, check.mine, self.world), **fields)
        rows = self.rows(np.concatenate([head, np.asarray(body, dtype=np.float64)]), phase=phase)
        summed = header.read(rows[:, : header.width].sum(axis=0))
        if not all_well(summed):
            self.settle(check, error)
        return summed, rows

    def settle(self, check: StatusCheck, error: BaseException | None) -> NoReturn:
        """The failure path, entered by every rank once a status word or an agreement check
        failed (and only then: it is the one collective a good step never makes): every rank
        sends its error and its text ``check.mine``, and all raise the same outcome — a failed
        rank its own error, the odd ones out a ``ValueError`` told ``check.fix``, the others
        :class:`~mixle_nb.parallel.fail_together.PeerRankError`. Never returns."""
        entries = self.gather((None if error is None else failure_message(error), check.mine))
        failures = {r: message for r, (message, _) in enumerate(entries) if message is not None}
        if not failures:
            failures = odd_ones_out({r: text for r, (_, text) in enumerate(entries)}, check.what, check.fix)
        if not failures:
            raise RuntimeError(
                f"{check.operation}: a status word said a rank failed, but no rank sent a failure message"
            )
        raise_failures(failures, self.rank, error, check.operation)
