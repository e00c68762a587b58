"""Logical shards: a fixed set of pieces of the data whose identity does not depend on which rank
holds them, and the fold that sums their statistics in shard-id order.

EM's statistics are sums, so any partition of the data folds to the same total up to the order
of floating-point additions. Fixing that order — shard 0, then 1, then 2, ..., each shard's
statistics computed from the same rows in the same parts wherever it is — makes the folded
statistics, and so the model, bit-identical whichever rank computed which shard and however many
ranks there are. A handle on in-memory data has one shard per rank (its rank's slice), so the
order is the rank order the fold always had; a handle built from files has ``count`` shards dealt
to the ranks, which ranks that outlive a lost one can read again (:func:`rebalance`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class ShardLayout:
    """``owners[s]``: the group rank holding logical shard ``s`` (of ``len(owners)``)."""

    owners: tuple

    @classmethod
    def one_per_rank(cls, world: int) -> ShardLayout:
        return cls(tuple(range(world)))

    @classmethod
    def dealt(cls, count: int, world: int) -> ShardLayout:
        """Shard ``s`` on rank ``s % world``: shard ``r`` on rank ``r`` when ``count == world``."""
        return cls(tuple(s % world for s in range(count)))

    @property
    def count(self) -> int:
        return len(self.owners)

    @property
    def slots(self) -> int:
        """The most shards one rank holds: the per-rank room in the fold's message."""
        return max(Counter(self.owners).values())

    def held_by(self, rank: int) -> list:
        return [s for s, owner in enumerate(self.owners) if owner == rank]

    def slot_of(self, shard: int) -> int:
        """Where shard ``shard`` sits among its owner's shards (they go in shard order)."""
        return self.held_by(self.owners[shard]).index(shard)


def rebalance(held: Sequence[Sequence[int]], count: int) -> tuple[ShardLayout, list, list]:
    """The layout after ranks were lost: ``held[r]`` are the shards new rank ``r`` still holds.

    A shard held twice (a rank that read it in a recovery that failed part way) stays with the
    lowest rank; each shard nobody holds goes, in shard order, to the rank holding fewest (ties:
    the lowest rank). Returns (the layout, per rank the shards to drop, per rank the shards to
    read)."""
    owners: dict = {}
    drop: list = [[] for _ in held]
    for rank, shards in enumerate(held):
        for s in shards:
            if s in owners:
                drop[rank].append(s)
            else:
                owners[s] = rank
    load = Counter(owners.values())
    adopt: list = [[] for _ in held]
    for s in range(count):
        if s not in owners:
            rank = min(range(len(held)), key=lambda r: (load[r], r))
            owners[s], load[rank] = rank, load[rank] + 1
            adopt[rank].append(s)
    return ShardLayout(tuple(owners[s] for s in range(count))), drop, adopt


def fold_in_shard_order(rows: np.ndarray, layout: ShardLayout, offset: int, width: int) -> np.ndarray:
    """The sum of every shard's vector, shard 0 first: ``rows[r]`` is rank ``r``'s message, its
    ``j``-th shard's vector at ``offset + j·width``."""
    total = np.zeros(width) if not layout.owners else None
    for s, owner in enumerate(layout.owners):
        start = offset + layout.slot_of(s) * width
        piece = rows[owner, start : start + width]
        total = piece.copy() if total is None else total + piece
    assert total is not None
    return total
