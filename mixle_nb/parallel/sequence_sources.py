"""Whole sequences read where they sit: the data sources of a handle of a hidden Markov model's
sequences (``from_npy(path, lengths=...)`` and ``from_files(paths, lengths=...)``).

An HMM's unit of data is a sequence, so a rank never holds part of one: a ``.npy`` file of rows
with a lengths file is cut into contiguous blocks of whole sequences, one block per logical
shard, balanced by rows; a list of files is dealt out file by file, each file one sequence or a
block of sequences with its own lengths file. Each rank reads only its own sequences' rows. The
parts a rank encodes are lists of sequences (arrays), what the HMM family's encoder takes.

Bad lengths are found before anything is encoded, on the rank that holds them, and named as the
user numbers the sequences: the global sequence index (sequences counted through the file, or
through the files in the order listed), the rows it spans, the file and the rank.
"""

from __future__ import annotations

import os
import zlib
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np

from .data_sources import _FromFiles
from .logical_shards import ShardLayout
from .shards import NpyRows, dealt_files, load_npy, part_bounds

PER_FILE = "per_file"  # from_files(lengths=PER_FILE): each file is one whole sequence


def read_lengths(lengths: Any, what: str) -> np.ndarray:
    """Sequence lengths from a ``.npy`` path or an array-like, as a 1-D int64 array."""
    values = np.load(os.fspath(lengths)) if isinstance(lengths, (str, os.PathLike)) else np.asarray(lengths)
    if values.ndim != 1 or (values.size and not np.issubdtype(values.dtype, np.integer)):
        raise ValueError(
            f"{what} must be a 1-D array of integers (one length per sequence); got shape {values.shape}, "
            f"dtype {values.dtype}: save them with np.save(path, np.asarray(lengths, dtype=np.int64))"
        )
    return values.astype(np.int64)


def check_lengths(lengths: np.ndarray, rows: int, first: int, where: str, held_by: Callable[[int], str]) -> None:
    """hmmlearn's checks of ``lengths`` against ``rows`` (its message for the sum), naming the
    first bad sequence by its global index (``first`` + its index here), ``where`` the rows are,
    and ``held_by(i)``: which rank holds sequence ``i`` (``-1``: the data as a whole)."""
    bad = np.flatnonzero(lengths <= 0)
    if bad.size:
        i = int(bad[0])
        local = f", its sequence {i}" if first else ""
        raise ValueError(
            f"sequence {first + i} ({where}{local}) has length {int(lengths[i])} on {held_by(i)}: "
            "every sequence needs at least one sample; drop it from the lengths and its rows from the data"
        )
    if int(lengths.sum()) != rows:
        raise ValueError(
            f"lengths array {lengths} doesn't sum to {rows} samples ({where}, on {held_by(-1)}): the lengths "
            "must count every row of the data, one length per sequence in the order the rows are stored"
        )


def balanced_cuts(ends: np.ndarray, shards: int) -> np.ndarray:
    """The first sequence of each of ``shards`` contiguous blocks of whole sequences (and the
    count at the end), each block holding about ``rows / shards`` rows: block ``s`` starts at
    the first sequence ending past ``s * rows / shards`` rows."""
    rows = int(ends[-1]) if len(ends) else 0
    targets = np.arange(1, shards) * rows / shards
    cuts = np.searchsorted(ends, targets, side="right")
    return np.concatenate([[0], cuts, [len(ends)]]).astype(np.int64)


def signature_of(lengths: np.ndarray) -> str:
    """What ranks agree on about the lengths: their count and a hash of all of them."""
    return f"{len(lengths)} sequences, lengths {zlib.crc32(np.ascontiguousarray(lengths).tobytes()):08x}"


class NpySequences(_FromFiles):
    """Whole sequences of a ``.npy`` file with a lengths file (``from_npy(path, lengths=...)``):
    logical shard ``s`` of ``S`` is the ``s``-th of ``S`` contiguous blocks of sequences, each
    about ``rows / S`` rows (a sequence is never cut), read as contiguous rows."""

    what = "the file"
    interleaved = False

    def __init__(self, path: str | os.PathLike, lengths: Any):
        super().__init__()
        self.path, self.given = os.fspath(path), lengths
        self.starts = self.ends = self.cuts = np.zeros(0, dtype=np.int64)

    def open(self, rank: int, world: int, layout: ShardLayout) -> None:
        super().open(rank, world, layout)
        rows = NpyRows(self.path, 0, 1)
        lengths = read_lengths(self.given, f"the lengths of {self.path}")
        self.ends = np.cumsum(lengths)
        self.starts = self.ends - lengths
        self.cuts = balanced_cuts(self.ends, layout.count)

        def held_by(sequence: int) -> str:
            if sequence < 0:
                return "every rank (each reads the lengths)"
            shard = int(np.searchsorted(self.cuts, sequence, side="right")) - 1
            return f"rank {layout.owners[shard]} (logical shard {shard})"

        check_lengths(lengths, rows.shape[0], 0, f"the rows of {self.path}", held_by)
        self.signature = f"{rows.describe()}; {signature_of(lengths)}"
        self.empty = []

    def parts(self, shard: int, sub_chunks: int) -> Iterable[Any]:
        first, end = int(self.cuts[shard]), int(self.cuts[shard + 1])
        rows = NpyRows(self.path, 0, 1)
        for a, b in part_bounds(end - first, sub_chunks):
            lo, hi = first + a, first + b
            block = rows.read(int(self.starts[lo]), int(self.ends[hi - 1]))
            yield np.split(block, (self.ends[lo : hi - 1] - self.starts[lo]).tolist())

    def locate(self, shard: int, part: int, shard_row: int, part_row: int) -> str:
        g = int(self.cuts[shard]) + shard_row
        return f"sequence {g} of {self.path} (its rows {int(self.starts[g])} to {int(self.ends[g]) - 1})"


class SequenceFiles(_FromFiles):
    """Files of whole sequences (``from_files(paths, lengths=...)``): files ``paths[s::S]`` are
    logical shard ``s`` of ``S``; each file is one sequence (``lengths="per_file"``) or a block
    of sequences whose lengths are in the file ``lengths[i]`` beside ``paths[i]``. Gathered
    back file by file, as listed."""

    what = "the file list"
    interleaved = False

    def __init__(self, paths: Sequence[Any], lengths: Any, reader: Callable[[str], Any] = load_npy):
        super().__init__()
        self.paths, self.reader, self.given = paths, reader, lengths
        self.names: list[str] = []
        self.length_files: list[str] | None = None
        self.first_sequence: dict[str, int] = {}  # a file's first sequence, counted through the list
        self.sources: list[tuple[str, int]] = []  # per part read: (path, its first sequence in the file)

    def open(self, rank: int, world: int, layout: ShardLayout) -> None:
        super().open(rank, world, layout)
        self.names = [os.fspath(p) for p in self.paths]
        self.signature = f"the file list {self.names}"
        if self.given == PER_FILE:
            counts = [1] * len(self.names)
        else:
            if isinstance(self.given, (str, os.PathLike)) or len(self.given) != len(self.names):
                raise ValueError(
                    f"from_files(lengths=...) takes {PER_FILE!r} (each file one sequence) or one lengths "
                    f"file per data file ({len(self.names)} of them, in the same order); got {self.given!r}"
                )
            self.length_files = [os.fspath(p) for p in self.given]
            counts = [len(np.load(p, mmap_mode="r")) for p in self.length_files]  # headers only
            self.signature += f", lengths in {self.length_files}"
        self.first_sequence = dict(zip(self.names, np.concatenate([[0], np.cumsum(counts)[:-1]]).tolist()))
        self.empty = []

    def _sequences(self, path: str) -> list:
        """The file's sequences (views of what ``reader`` gave), its lengths checked against its rows."""
        data = self.reader(path)
        if self.length_files is None:
            return [data]
        lengths_path = self.length_files[self.names.index(path)]
        lengths = read_lengths(lengths_path, f"the lengths in {lengths_path}")
        where = f"{path}, lengths in {lengths_path}"
        check_lengths(lengths, len(data), self.first_sequence[path], where, lambda _: f"rank {self.rank}")
        return np.split(data, np.cumsum(lengths)[:-1].tolist()) if len(lengths) else []

    def parts(self, shard: int, sub_chunks: int) -> Iterable[Any]:
        for path in dealt_files(self.names, shard, self.shard_count):
            sequences = self._sequences(path)
            for a, b in part_bounds(len(sequences), sub_chunks):
                self.sources.append((path, a))
                yield sequences[a:b]

    def locate(self, shard: int, part: int, shard_row: int, part_row: int) -> str:
        path, first = self.sources[part]
        g = self.first_sequence[path] + first + part_row
        return (
            f"sequence {g} ({path})"
            if self.length_files is None
            else f"sequence {g} ({path}, its sequence {first + part_row})"
        )

    def origin(self, shard: int, part: int, row: int) -> Any:
        path, first = self.sources[part]
        return (self.first_sequence[path] + first,)
