"""Where a rank's observations come from: its slice of data every rank holds, or its part of a
``.npy`` file or of a list of files, read by the rank itself so the data never pass through
the notebook. A shard is cut into parts, each encoded once; raw parts are produced one at a
time so that only one raw part is alive beside the encodings."""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import zlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

READ_BLOCK_BYTES = 32 << 20  # one read from a file; bounds a rank's memory beside its shard


def _libc_trim() -> Callable[[int], int] | None:
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    except (OSError, AttributeError):  # not glibc: nothing to trim
        return None


_MALLOC_TRIM = _libc_trim()


def release_freed_memory() -> None:
    """Hand memory freed by a raw part back to the system before the next part is read.

    glibc raises its mmap threshold to the size of the largest block freed, so after the first
    part its successors' raw data and temporaries come from the heap, between the encodings
    that stay; the holes they leave are never returned, and a shard of N values peaked near
    1.5x its encoding. Trimming after each part keeps the peak at the encoding plus one part."""
    if _MALLOC_TRIM is not None:
        _MALLOC_TRIM(0)


def rank_slice(data: Any, rank: int, world: int) -> Any:
    """Observations ``rank, rank + world, ...``: a view of a numpy array, a list otherwise
    (ragged sequences, tuples, strings, dicts stay as they are, never converted to an array)."""
    if isinstance(data, np.ndarray):
        return data[rank::world]
    try:
        part = data[rank::world]
    except (TypeError, KeyError):  # a sequence that cannot take a step slice
        part = [data[i] for i in range(rank, len(data), world)]
    return part if isinstance(part, list) else list(part)


def part_bounds(n: int, parts: int) -> list:
    """``parts`` contiguous ``(start, stop)`` ranges covering ``range(n)``, empty ones dropped."""
    bounds = np.linspace(0, n, parts + 1).astype(int)
    return [(int(a), int(b)) for a, b in zip(bounds, bounds[1:]) if b > a]


def split_parts(shard: Any, parts: int) -> Iterator[Any]:
    """The shard's contiguous parts (views of an array, lists of a list), in shard order."""
    for a, b in part_bounds(len(shard), parts):
        yield shard[a:b]


FINGERPRINT_ROWS = 64  # observations hashed into the content fingerprint, evenly spaced


def describe(data: Any) -> str:
    """What every rank must agree on about the full data it passed: its kind and size, for an
    array the shape of one observation and the dtype, and a fingerprint of its content (a hash
    of :data:`FINGERPRINT_ROWS` evenly spaced observations, so data of the same size that
    differ by rank — each rank's part of a scatter — are told apart at a cost independent of N)."""
    if isinstance(data, np.ndarray):
        return (
            f"an array of {len(data)} observations of shape {data.shape[1:]}, dtype {data.dtype}, "
            f"content {content_print(data)}"
        )
    return f"a {type(data).__name__} of {len(data)} observations, content {content_print(data)}"


def content_print(data: Any) -> str:
    """A short hash of evenly spaced observations of ``data`` (bytes of an array's rows, the
    ``repr`` of other observations)."""
    n = len(data)
    picked = sorted(set(np.linspace(0, n - 1, min(n, FINGERPRINT_ROWS)).astype(int).tolist())) if n else []
    if isinstance(data, np.ndarray) and not data.dtype.hasobject:
        payload = np.ascontiguousarray(data[picked]).tobytes()
    else:
        payload = repr([data[i] for i in picked]).encode()
    return f"{zlib.crc32(payload):08x}"


def describe_rows(shard: Any) -> str | None:
    """What ranks must agree on about their own shards (whose sizes differ): an array's
    observation shape and dtype; nothing for other sequences or an empty shard."""
    if isinstance(shard, np.ndarray) and len(shard):
        return f"observations of shape {shard.shape[1:]}, dtype {shard.dtype}"
    return None


class NpyRows:
    """A C-ordered ``.npy`` file read as rows ``rank, rank + world, ...``, part by part.

    The header comes from a memory map (nothing else of it is touched); rows are read with
    plain reads of at most :data:`READ_BLOCK_BYTES`, so a rank holds its strided rows and one
    block, and no mapped pages of the rest of the file count against its memory."""

    def __init__(self, path: str, rank: int, world: int):
        self.path = os.fspath(path)
        header = np.load(self.path, mmap_mode="r")
        if not isinstance(header, np.memmap) or header.ndim == 0:
            raise ValueError(f"{self.path}: expected a .npy array of observations (one per row)")
        if header.dtype.hasobject:
            raise ValueError(f"{self.path}: object arrays cannot be read in parts; save a numeric array")
        if header.ndim > 1 and not header.flags.c_contiguous:
            raise ValueError(
                f"{self.path}: the array is stored in Fortran order; save it with "
                "np.save(path, np.ascontiguousarray(x))"
            )
        self.shape, self.dtype, self.offset = header.shape, header.dtype, header.offset
        del header
        self.rank, self.world = rank, world
        self.row_bytes = int(np.prod(self.shape[1:], dtype=np.int64)) * self.dtype.itemsize
        self.count = len(range(rank, self.shape[0], world))  # this rank's observations

    def describe(self) -> str:
        return f"{self.path}: {self.shape[0]} observations of shape {self.shape[1:]}, dtype {self.dtype}"

    def empty(self) -> np.ndarray:
        """No rows, with the file's row shape and dtype."""
        return np.empty((0,) + self.shape[1:], dtype=self.dtype)

    def parts(self, parts: int) -> Iterator[np.ndarray]:
        """The rank's rows in ``parts`` contiguous parts of its shard, each read when asked for."""
        for a, b in part_bounds(self.count, parts):
            yield self.read(a, b)

    def read(self, a: int, b: int) -> np.ndarray:
        """Shard rows ``a:b``: file rows ``rank + world·i`` for ``i`` in ``[a, b)``."""
        out = np.empty((b - a,) + self.shape[1:], dtype=self.dtype)
        per_block = max(1, READ_BLOCK_BYTES // max(1, self.row_bytes * self.world))  # shard rows per read
        buffer = np.empty(per_block * self.world * self.row_bytes, dtype=np.uint8)
        with open(self.path, "rb", buffering=0) as f:
            for start in range(a, b, per_block):
                stop = min(b, start + per_block)
                first = self.rank + self.world * start  # file row of shard row `start`
                rows = (stop - start - 1) * self.world + 1
                view = buffer.data[: rows * self.row_bytes]
                f.seek(self.offset + first * self.row_bytes)
                if f.readinto(view) != len(view):
                    raise ValueError(f"{self.path}: file ends before row {first + rows}; is it truncated?")
                block = np.frombuffer(view, dtype=self.dtype).reshape((rows,) + self.shape[1:])
                out[start - a : stop - a] = block[:: self.world]
        return out


def dealt_files(paths: Sequence[Any], rank: int, world: int) -> list:
    """Files ``rank, rank + world, ...`` of ``paths``: each rank reads whole files of its own."""
    return [os.fspath(p) for p in list(paths)[rank::world]]


def load_npy(path: str) -> Any:
    """The default reader for :func:`dealt_files`: a memory-mapped ``.npy``, copied by encoding."""
    return np.load(path, mmap_mode="r")


def file_parts(
    paths: Sequence[str], reader: Callable[[str], Any], sub_chunks: int, counts: list, sources: list | None = None
) -> Iterator[Any]:
    """Each file's observations in ``sub_chunks`` parts, read one file at a time; the size of
    each part is appended to ``counts`` as it is produced, and ``(path, its first row in the
    file, the file's index in paths)`` to ``sources``."""
    for number, path in enumerate(paths):
        data = reader(path)
        for (start, _), part in zip(part_bounds(len(data), sub_chunks), split_parts(data, sub_chunks)):
            counts.append(len(part))
            if sources is not None:
                sources.append((path, start, number))
            yield part


def empty_like_rows(data: Any) -> Any:
    """No observations of ``data``'s kind (an array keeps its row shape and dtype): what a rank
    dealt no file encodes, so that it takes part in every operation like the others."""
    return np.array(data[:0]) if isinstance(data, np.ndarray) else []
