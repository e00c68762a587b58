"""Where a :class:`~mixle_nb.parallel.em_handle.TorchRunEncodedData`'s observations come from.

The handle has one constructor; what differs between data passed in memory, a shard scattered
beforehand, the rows of a ``.npy`` file and a list of files is a :class:`DataSource`: how a rank
finds its logical shards' raw parts (read again after a rank died, for the sources that can be),
what every rank must agree on about them, how a bad row is named to the user and where each part
sits in the data's order.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np

from ..validation import positive_int
from .exchange import RankExchange
from .logical_shards import ShardLayout
from .shards import (
    NpyRows,
    dealt_files,
    describe,
    describe_rows,
    empty_like_rows,
    file_parts,
    load_npy,
    rank_slice,
    split_parts,
)

SAME_DATA = (
    "pass the same full data on every rank (each keeps "
    "data[rank::world] of it), or root_only=True with the data on the root. Did you %mixle_scatter "
    "it? For data already split across ranks use TorchRunEncodedData.from_shards(shard, estimator=...)"
)
SAME_ROWS = "every rank's observations must have the same shape and dtype"
SAME_FILES = "every rank must pass the same path (or list of paths); each rank reads its own part of it"
NOT_ELASTIC = (
    "elastic=True needs data the ranks can read again when a rank dies, and {what} lives only in "
    "the ranks' memory (lost with a rank): save it (np.save) and build the handle with "
    "TorchRunEncodedData.from_npy(path, ..., elastic=True) or from_files(paths, ..., elastic=True)"
)


class DataSource:
    """A handle's observations, as each rank reads its logical shards of them.

    The handle calls :meth:`layout` before it joins the group (an argument check every rank
    makes alike), :meth:`open` inside the construction's carried ``try`` (an error there fails
    every rank together), :meth:`share` on every rank after it (the one source that needs a
    collective scatters there), then :meth:`parts` for each shard it holds, at construction and
    again in ``rejoin``.

    Attributes: ``what`` (what the data are called in errors), ``fix`` (what to do when ranks'
    ``signature`` differ), ``signature`` (what every rank must agree on; ``None``: nothing),
    ``empty`` (no observations of the data's kind, encoded by a rank that holds none),
    ``interleaved`` (shard ``s`` of ``S`` holds observations ``s, s + S, ...``; else each part
    is a block at :meth:`origin`), ``counts`` (the sizes of the parts as read, when the source
    counts them), ``held_in`` (for a source that cannot be read again: where it lives)."""

    what = "the data"
    fix = SAME_ROWS
    interleaved = True
    held_in: str | None = None  # None: the ranks can read it again (elastic=True works)

    def __init__(self) -> None:
        self.signature: str | None = None
        self.empty: Any = None
        self.counts: list[int] | None = None
        self.rank, self.world, self.shard_count = 0, 1, 1

    @property
    def rereadable(self) -> bool:
        """Whether the ranks can read a shard again after a rank died."""
        return self.held_in is None

    def layout(self, world: int, shards: int | None) -> ShardLayout:
        """Which rank holds which logical shard: ``shards`` of them (``None``: one per rank)."""
        if shards is not None:
            raise ValueError(
                f"shards={shards} needs data the ranks read themselves: build the handle with "
                "TorchRunEncodedData.from_npy or from_files"
            )
        return ShardLayout.one_per_rank(world)

    def open(self, rank: int, world: int, layout: ShardLayout) -> None:
        """Find this rank's data (and set ``signature`` and ``empty``); may raise."""
        self.rank, self.world, self.shard_count = rank, world, layout.count

    def share(self, exchange: RankExchange) -> None:
        """Every rank, after :meth:`open` whether or not it raised: a collective step, if any."""

    def release(self) -> None:
        """Construction is over: drop what only it needed (raw data a rank cannot read again)."""

    def parts(self, shard: int, sub_chunks: int) -> Iterable[Any]:
        """Logical shard ``shard``'s raw parts, each read when asked for."""
        raise NotImplementedError

    def locate(self, shard: int, part: int, shard_row: int, part_row: int) -> str:
        """Row ``shard_row`` of logical shard ``shard`` (row ``part_row`` of part number
        ``part``) as the user knows it."""
        return f"row {self.rank + self.world * shard_row} of the data"

    def origin(self, shard: int, part: int, row: int) -> Any:
        """A sortable key of where part ``part`` (from shard row ``row``) sits in the data."""
        return (shard, row)


class SameData(DataSource):
    """The same full data passed on every rank; rank ``r`` keeps ``data[r::world]``."""

    held_in = "data passed to the constructor"

    def __init__(self, data: Sequence | None):
        super().__init__()
        self.data: Any = data
        self.shard: Any = None
        self.fix = "rank {rank} holds other data: " + SAME_DATA

    def open(self, rank: int, world: int, layout: ShardLayout) -> None:
        super().open(rank, world, layout)
        if self.data is None:
            raise ValueError(f"data is None on rank {rank}: {SAME_DATA}")
        self.shard, self.signature = rank_slice(self.data, rank, world), describe(self.data)
        self.empty = self.shard[:0]

    def parts(self, shard: int, sub_chunks: int) -> Iterable[Any]:
        return () if self.shard is None else split_parts(self.shard, sub_chunks)

    def release(self) -> None:
        self.data = self.shard = None  # the encodings are what the handle keeps


class RootData(SameData):
    """The full data on the root only (``root_only=True``), scattered to the ranks."""

    def __init__(self, data: Sequence | None, root: int):
        super().__init__(data)
        self.root, self.fix = root, SAME_ROWS
        self._dealt: list | None = None

    def open(self, rank: int, world: int, layout: ShardLayout) -> None:
        DataSource.open(self, rank, world, layout)
        if rank != self.root:
            return
        if self.data is None:
            raise ValueError(
                f"root_only=True needs the data on the root (rank {self.root}), "
                "which got None: pass it there (other ranks may pass None)"
            )
        self._dealt = [rank_slice(self.data, r, world) for r in range(world)]

    def share(self, exchange: RankExchange) -> None:
        self.shard = exchange.scatter(self._dealt)
        self._dealt = None
        if self.shard is not None:
            self.signature, self.empty = describe_rows(self.shard), self.shard[:0]


class ScatteredShard(DataSource):
    """Each rank's own observations, all of which it keeps (``from_shards``)."""

    what = "the shard"
    held_in = "a shard passed from memory (scattered or pushed)"

    def __init__(self, shard: Sequence | None, interleaved: bool = True):
        super().__init__()
        self.shard: Any = shard
        self.interleaved = bool(interleaved)

    def open(self, rank: int, world: int, layout: ShardLayout) -> None:
        super().open(rank, world, layout)
        if self.shard is None:
            raise ValueError(
                f"from_shards got None on rank {rank}: pass this rank's observations (an empty sequence if it has none)"
            )
        self.shard = self.shard if isinstance(self.shard, np.ndarray) else rank_slice(self.shard, 0, 1)
        self.signature, self.empty = describe_rows(self.shard), self.shard[:0]

    def parts(self, shard: int, sub_chunks: int) -> Iterable[Any]:
        return () if self.shard is None else split_parts(self.shard, sub_chunks)

    def release(self) -> None:
        self.shard = None  # the encodings are what the handle keeps

    def locate(self, shard: int, part: int, shard_row: int, part_row: int) -> str:
        return f"row {shard_row} of the shard passed on rank {self.rank}"


class _FromFiles(DataSource):
    """Data every rank can read again: logical shards of any count, dealt to the ranks."""

    fix = SAME_FILES

    def layout(self, world: int, shards: int | None) -> ShardLayout:
        if shards is not None and positive_int("shards", shards) < world:
            raise ValueError(
                f"shards={shards} is fewer than the {world} ranks: every rank needs a "
                f"shard; pass shards >= {world} (or None: one per rank)"
            )
        return ShardLayout.dealt(shards or world, world)


class NpyFile(_FromFiles):
    """Rows ``s, s + S, ...`` of a ``.npy`` file as logical shard ``s`` of ``S`` (``from_npy``)."""

    what = "the file"

    def __init__(self, path: str | os.PathLike):
        super().__init__()
        self.path = os.fspath(path)

    def open(self, rank: int, world: int, layout: ShardLayout) -> None:
        super().open(rank, world, layout)
        rows = NpyRows(self.path, layout.held_by(rank)[0], layout.count)
        self.signature, self.empty = rows.describe(), rows.empty()

    def parts(self, shard: int, sub_chunks: int) -> Iterable[Any]:
        return NpyRows(self.path, shard, self.shard_count).parts(sub_chunks)

    def locate(self, shard: int, part: int, shard_row: int, part_row: int) -> str:
        return f"row {shard + self.shard_count * shard_row} of {self.path}"


class FileList(_FromFiles):
    """Files ``paths[s::S]`` as logical shard ``s`` of ``S``, each read whole by ``reader``
    (``from_files``); gathered back file by file, as listed."""

    what = "the file list"
    interleaved = False

    def __init__(self, paths: Sequence[Any], reader: Callable[[str], Any] = load_npy):
        super().__init__()
        self.paths, self.reader = paths, reader
        self.names: list[str] = []
        self.part_sizes: list[int] = []
        self.counts = self.part_sizes
        self.sources: list[tuple[str, int, int]] = []  # per part read: (path, its first row, file index)

    def open(self, rank: int, world: int, layout: ShardLayout) -> None:
        super().open(rank, world, layout)
        self.names = [os.fspath(p) for p in self.paths]
        self.signature = f"the file list {self.names}"
        mine = [name for s in layout.held_by(rank) for name in dealt_files(self.names, s, layout.count)]
        if not mine and self.names:  # an empty rank: the first file's kind of row, so every step works
            self.empty = empty_like_rows(self.reader(self.names[0]))

    def parts(self, shard: int, sub_chunks: int) -> Iterable[Any]:
        files = dealt_files(self.names, shard, self.shard_count)
        return file_parts(files, self.reader, sub_chunks, self.part_sizes, self.sources)

    def locate(self, shard: int, part: int, shard_row: int, part_row: int) -> str:
        path, first, _ = self.sources[part]
        return f"row {first + part_row} of {path}"

    def origin(self, shard: int, part: int, row: int) -> Any:
        _, first, index = self.sources[part]
        return (shard + self.shard_count * index, first)
