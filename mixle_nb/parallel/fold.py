"""The fold: every rank's sufficient statistics combined into the same total on every rank.

The ranks agree once per estimator how its statistics cross (:class:`StatisticsFold`): numeric
statistics of one layout on every rank take one all-reduce-sized exchange of flat vectors
(``values.FoldPlan``), anything else is pickled to the root, combined there with the
accumulator's own ``combine`` (any value: mixle's too) and the total broadcast. Either way the
logical shards' parts are added in shard order, so the total — and the M-step after it — is bit
for bit the same whichever rank held which shard. A rank's failure, and a rank whose estimator
or model differs, ride in the same messages, so every rank raises together.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..stats.base import Estimator
from ..stats.estimation import Accumulated
from ..stats.values import FoldPlan, flatten_value, fold_plan, value_layout
from ..validation import choice
from .exchange import STATUS, Header, RankExchange, StatusCheck
from .fail_together import failure_message, fingerprint, odd_ones_out, raise_failures
from .logical_shards import ShardLayout, fold_in_shard_order

FOLDS = ("auto", "gather", "allreduce")
SAME_MODEL = "every rank must pass the same model and estimator to the step"
ALLREDUCE_HEADER = Header(**STATUS, replan=1)  # replan: this rank's statistics left the agreed plan
_ESTIMATOR_PRINTS_KEPT = 16


@dataclass(frozen=True)
class AgreedFold:
    """How statistics of one estimator cross ranks, as all ranks agreed: ``plan`` is the
    all-reduce's :class:`FoldPlan`, ``None`` for the gather path."""

    estimator: str  # the estimator's fingerprint
    plan: FoldPlan | None

    @property
    def path(self) -> str:
        return "gather" if self.plan is None else "allreduce"


@dataclass
class _Round:
    """One fold's inputs on this rank: the operation (named in errors), the shard layout, this
    rank's statistics (one :class:`Accumulated` per shard it holds, and their values), the
    accumulator to fold into, this rank's error, and its estimator's and model's fingerprints."""

    operation: str
    layout: ShardLayout
    pieces: list
    values: list
    into: Any
    error: BaseException | None
    est_print: str | None
    model_print: str | None


class StatisticsFold:
    """Folds statistics over the ranks of ``exchange``, by the path ``fold`` (``"auto"``,
    ``"gather"``, ``"allreduce"``). Also the :class:`~mixle_nb.stats.kmeans.Exchange` that
    k-means‖ runs on."""

    def __init__(self, exchange: RankExchange, fold: str = "auto"):
        self.exchange, self.choice = exchange, choice("fold", fold, FOLDS)
        self.rank, self.world = exchange.rank, exchange.world
        self.agreed: AgreedFold | None = None
        self.last_floats: int | None = None  # float64s the last all-reduce fold sent; None: gathered
        self._estimator_prints: dict = {}

    # -- the k-means‖ exchange ------------------------------------------------------------------

    def sum(self, numbers: Any) -> np.ndarray:
        return self.exchange.sum(numbers)

    def fold(self, estimator: Estimator, count: float, acc: Any) -> float:
        """Combine every rank's ``acc`` (one part per rank, in rank order) into ``acc``; the
        global count."""
        pieces = [Accumulated(count, acc, float("nan"))]
        return self.shards(estimator, pieces, ShardLayout.one_per_rank(self.world), acc)[0]

    # -- folding ---------------------------------------------------------------------------------

    def estimator_print(self, estimator: Estimator) -> str:
        """The estimator's fingerprint, computed once per estimator object."""
        known = self._estimator_prints.get(id(estimator))
        if known is None or known[0] is not estimator:
            if len(self._estimator_prints) > _ESTIMATOR_PRINTS_KEPT:
                self._estimator_prints.clear()
            known = (estimator, fingerprint(estimator))
            self._estimator_prints[id(estimator)] = known
        return known[1]

    def path(self, estimator: Estimator, value: Any) -> AgreedFold:
        """The agreed fold for ``estimator`` (agreeing now if need be, from a statistics
        ``value`` of this rank's)."""
        agreed = self.agreed
        if agreed is None or agreed.estimator != self.estimator_print(estimator):
            agreed = self._negotiate(
                "folding statistics", estimator, value, None, self.estimator_print(estimator), None
            )
        return agreed

    def shards(
        self,
        estimator: Estimator,
        pieces: list | None,
        layout: ShardLayout,
        into: Any = None,
        *,
        model: Any = None,
        error: BaseException | None = None,
        operation: str = "folding statistics",
    ) -> tuple[float, float, Any]:
        """Combine the statistics of every logical shard of ``layout`` into ``into`` (a fresh
        accumulator when ``None``) on every rank, summed in shard order; returns the global
        ``(count, log_density, into)``. ``pieces``: this rank's statistics, one
        :class:`Accumulated` per shard it holds, in shard order.

        ``error``: this rank already failed (``pieces`` may be ``None``); it still takes part, so
        every rank raises together. ``model``: the model the statistics were taken under, which
        must be the same on every rank."""
        values = est_print = model_print = None
        try:
            est_print = self.estimator_print(estimator)
            model_print = None if model is None else fingerprint(model)
            if error is None:
                values = [piece.accumulator.value() for piece in pieces or ()]
                into = estimator.accumulator_factory().make() if into is None else into
        except Exception as exc:
            error = error or exc
        mine = _Round(operation, layout, list(pieces or ()), values or [], into, error, est_print, model_print)
        while True:
            agreed = self.agreed
            if agreed is None:
                first = values[0] if values else None
                agreed = self._negotiate(operation, estimator, first, error, est_print, model_print)
            if agreed.plan is None:
                return self._gather(estimator, mine)
            folded = self._allreduce(agreed, agreed.plan, mine)
            if folded is not None:
                return folded
            self.agreed = None  # some rank's statistics no longer fit the plan: agree again

    def _negotiate(
        self,
        operation: str,
        estimator: Estimator,
        value: Any,
        error: BaseException | None,
        est_print: str | None,
        model_print: str | None,
    ) -> AgreedFold:
        """Agree, once per estimator, how its statistics cross ranks; also where every rank
        compares estimator and model and learns of any failure. Sets and returns ``self.agreed``."""
        plan = None
        if error is None and self.choice != "gather":
            try:
                plan = fold_plan(value, estimator.accumulator_factory().make)
            except Exception as exc:  # still take part in the exchange below
                error = exc
        entries = self.exchange.gather(
            (None if error is None else failure_message(error), est_print, model_print, plan)
        )
        failures = _failures([entry[:3] for entry in entries])
        if failures:
            raise_failures(failures, self.rank, error, operation)
        plans = [entry[3] for entry in entries]
        same = plans[0] is not None and all(p == plans[0] for p in plans)
        if self.choice == "allreduce" and not same:
            raise ValueError(
                "fold='allreduce' needs numeric statistics with the same layout on every "
                f"rank, which combine adds; got {len(set(map(repr, plans)))} layouts. "
                "Use fold='gather' or 'auto'"
            )
        assert est_print is not None  # else this rank failed, and every rank raised above
        self.agreed = AgreedFold(est_print, plans[0] if same else None)
        return self.agreed

    def _allreduce(self, agreed: AgreedFold, plan: FoldPlan, mine: _Round) -> tuple[float, float, Any] | None:
        """One message per rank: its status, then for each shard it holds, that shard's count,
        log-density and statistics; every rank adds the shards' parts in shard order. Returns
        ``None`` when a rank asked to agree a new plan."""
        layout, error, width = mine.layout, mine.error, 2 + plan.size
        body, fits = np.zeros(layout.slots * width), False
        if error is None:
            try:
                fits = mine.est_print == agreed.estimator
                for slot, (piece, value) in enumerate(zip(mine.pieces, mine.values)):
                    flat = flatten_value(value)
                    fits = fits and value_layout(value) == plan.layout and plan.matches(flat)
                    if not fits:
                        break
                    body[slot * width], body[slot * width + 1] = piece.count, piece.log_density
                    body[slot * width + 2 : (slot + 1) * width] = flat
            except Exception as exc:
                error = exc
        if not fits:
            body[:] = 0.0
        check = StatusCheck(mine.operation, mine.model_print, "the model on this rank", SAME_MODEL)
        self.last_floats = ALLREDUCE_HEADER.width + len(body)
        summed, rows = self.exchange.checked_rows(
            ALLREDUCE_HEADER, check, error, body, phase="fold", replan=float(error is None and not fits)
        )
        if summed.replan > 0:
            return None
        total = fold_in_shard_order(rows, layout, ALLREDUCE_HEADER.width, width)
        mine.into.from_value(plan.restore(total[2:]))
        return float(total[0]), float(total[1]), mine.into

    def _gather(self, estimator: Estimator, mine: _Round) -> tuple[float, float, Any]:
        """The reference path: statistics pickled to the root, combined there in shard order
        (mixle's ``combine``, so any value works), the sum broadcast; failures ride in both
        messages."""
        error = mine.error
        sent = (
            ("failed", failure_message(error))
            if error is not None
            else (
                "ok",
                mine.est_print,
                mine.model_print,
                [(p.count, p.log_density, v) for p, v in zip(mine.pieces, mine.values)],
            )
        )
        self.last_floats = None
        parts = self.exchange.gather_to_root(sent, phase="fold")
        message = self._combine_on_root(estimator, parts, mine.layout) if parts is not None else None
        message = self.exchange.broadcast(message)
        if message[0] == "failed":
            raise_failures(message[1], self.rank, error, mine.operation)
        _, count, log_density, value, renegotiate = message
        mine.into.from_value(value)
        if renegotiate:
            self.agreed = None
        return float(count), float(log_density), mine.into

    def _combine_on_root(self, estimator: Estimator, parts: list, layout: ShardLayout) -> tuple:
        failures = _failures([(p[1], None, None) if p[0] == "failed" else (None, p[1], p[2]) for p in parts])
        if failures:
            return ("failed", failures)
        total = estimator.accumulator_factory().make()
        count = log_density = 0.0
        for shard, owner in enumerate(layout.owners):
            shard_count, shard_log_density, value = parts[owner][3][layout.slot_of(shard)]
            try:
                total.combine(value)
            except Exception as exc:
                return (
                    "failed",
                    {owner: f"its statistics could not be combined with rank 0's: {failure_message(exc)}"},
                )
            count, log_density = count + shard_count, log_density + shard_log_density
        renegotiate = self.agreed is None or parts[0][1] != self.agreed.estimator
        return ("ok", count, log_density, total.value(), renegotiate)


def _failures(entries: list) -> dict:
    """From every rank's ``(failure message or None, estimator print, model print)``: the ranks
    that failed (rank -> message); else those whose estimator differs from the rest's; else
    those whose model does."""
    failures = {r: message for r, (message, _, _) in enumerate(entries) if message is not None}
    if not failures:
        failures = odd_ones_out({r: e[1] for r, e in enumerate(entries)}, "the estimator on this rank", SAME_MODEL)
    if not failures:
        failures = odd_ones_out({r: e[2] for r, e in enumerate(entries)}, "the model on this rank", SAME_MODEL)
    return failures
