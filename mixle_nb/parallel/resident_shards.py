"""The encoded chunks one rank of a :class:`~mixle_nb.parallel.em_handle.TorchRunEncodedData`
holds, by logical shard: read from its :class:`~mixle_nb.parallel.data_sources.DataSource` one raw
part at a time, encoded, and dropped or read again when ranks die.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np

from ..stats.estimation import encode
from ..stats.hmm.encoding import SequenceError
from .data_sources import DataSource
from .fail_together import failure_message
from .shards import release_freed_memory


class ResidentShards:
    """What a rank keeps of its logical shards.

    ``chunks[i]`` encodes ``counts[i]`` observations; ``shard_chunks`` lists ``(shard id, first
    chunk, end chunk)`` of each shard held, in shard order; ``origins[i]`` is where chunk ``i``
    sits in the data's order (``source.origin``; ``None`` for an empty chunk); ``sample`` is one
    observation (``None`` on an empty rank), to check a model against. ``encoder`` encodes on
    ``device`` (``None``: where it encodes by default)."""

    def __init__(self, source: DataSource, rank: int) -> None:
        self.source, self.rank = source, rank
        self.encoder: Any = None
        self.device: Any = None
        self.chunks: list = []
        self.counts: list[int] = []
        self.shard_chunks: list[tuple[int, int, int]] = []
        self.origins: list = []
        self.sample: Any = None
        self._parts_read = 0  # parts are numbered as produced (a file list's sources)

    @property
    def count(self) -> int:
        """The observations this rank holds."""
        return int(sum(self.counts))

    def read(self, pieces: Iterable[tuple[int, Iterable[Any]]]) -> int:
        """Encode ``pieces`` ((shard id, its raw parts); one part alive at a time) after the
        chunks held; returns the rows read. An encoder's error on a part holding a NaN or an
        infinity names that row as the user knows it."""
        rows, number = 0, self._parts_read
        for sid, parts in pieces:
            first, shard_rows = len(self.chunks), 0
            for part in parts:
                shard_rows += len(part)
                if self.sample is None and len(part):
                    self.sample = _copy(part[:1])
                if len(part):  # an empty part has nothing to encode (some encoders refuse it)
                    try:
                        self.chunks.append(encode(self.encoder, part, self.device))
                    except Exception as exc:
                        locate = functools.partial(self.source.locate, sid, number)
                        raise _located(exc, part, shard_rows - len(part), locate, self.rank) from exc
                    self.counts.append(len(part))
                    self.origins.append(self.source.origin(sid, number, shard_rows - len(part)))
                number += 1
                self._parts_read = number
                del part
                release_freed_memory()
            self.shard_chunks.append((sid, first, len(self.chunks)))
            rows += shard_rows
        self.shard_chunks.sort()
        return rows

    def keep_empty(self, empty: Any) -> None:
        """A rank that read no observation keeps the encoding of ``empty`` (none of the data's
        kind) where the encoder takes one: it tells k-means‖ the dimension."""
        if self.sample is None:
            self.sample = empty
        if self.chunks:
            return
        try:
            encoded = encode(self.encoder, np.zeros(0) if empty is None else empty, self.device)
        except Exception:  # mixle's encoders refuse empty data; the shard then holds no chunk
            return
        self.chunks.append(encoded)
        self.counts.append(0)
        self.origins.append(None)
        sid, start, _ = self.shard_chunks[-1]
        self.shard_chunks[-1] = (sid, start, len(self.chunks))

    def drop(self, shards: Sequence[int]) -> None:
        """Forget the logical shards ``shards``."""
        kept = [
            (s, self.chunks[a:b], self.counts[a:b], self.origins[a:b])
            for s, a, b in self.shard_chunks
            if s not in shards
        ]
        self.clear()
        for shard, chunks, counts, origins in kept:
            self.shard_chunks.append((shard, len(self.chunks), len(self.chunks) + len(chunks)))
            self.chunks += chunks
            self.counts += counts
            self.origins += origins

    def clear(self) -> None:
        """Hold nothing."""
        self.chunks, self.counts, self.shard_chunks, self.origins = [], [], [], []


def _copy(rows: Any) -> Any:
    """``rows`` as a copy that holds no reference to the part they came from (a memory map)."""
    return np.array(rows) if isinstance(rows, np.ndarray) else list(rows)


def _located(
    error: BaseException, part: Any, start: int, locate: Callable[[int, int], str], rank: int
) -> BaseException:
    """``error`` (an encoder's), or, when ``part`` (shard rows from ``start``) holds a NaN or an
    infinity, an error naming the first such row as the user knows it (``locate(shard_row,
    part_row)``): the encoder's own message counts within the part. A sequence the encoder
    refused (:class:`~mixle_nb.stats.hmm.encoding.SequenceError`, counted within the part) is
    named the same way."""
    if isinstance(error, SequenceError):
        return ValueError(
            f"{locate(start + error.sequence, error.sequence)} {error.problem} on rank {rank}: {error.fix}"
        )
    row = _first_non_finite(part)
    if row is None:
        return error
    return ValueError(
        f"{locate(start + row, row)} is NaN or infinite: drop or impute it first (rank {rank}'s "
        f"encoder, counting within its part: {failure_message(error)})"
    )


def _first_non_finite(part: Any) -> int | None:
    """The first row of ``part`` holding a NaN or an infinity; rows of different lengths (an
    HMM's sequences) are looked at one by one. None if there is none, or the rows are not numbers."""
    try:
        values = np.asarray(part, dtype=np.float64)
    except (TypeError, ValueError):  # ragged rows, or not numbers
        for i, item in enumerate(part):
            try:
                if not np.all(np.isfinite(np.asarray(item, dtype=np.float64))):
                    return i
            except (TypeError, ValueError):  # not numbers: the encoder's error stands
                return None
        return None
    bad = np.flatnonzero(~np.isfinite(values.reshape(len(values), -1)).all(axis=1))
    return int(bad[0]) if len(bad) else None
