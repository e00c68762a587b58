"""Flat codec for accumulator values, so a distributed fold can add them as one tensor.

A value is flattenable when it is built only from numeric arrays and scalars, tuples and lists,
with ``None``, booleans and strings as fixed parts (every numeric family, mixtures of them,
mixle's hidden Markov model). Dicts (categorical counts) are not: their keys differ by shard,
so those values are folded by gathering instead.

Not every number in a value is a sum: mixle's hidden Markov statistics start with the number
of states, which ``combine`` keeps rather than adds. :func:`fold_plan` asks the accumulator's own
``combine`` which numbers add (combining a value with itself doubles them) and which it keeps.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np


def value_layout(value: Any) -> Any | None:
    """A hashable description of ``value``'s structure, or ``None`` if it cannot be flattened."""
    if isinstance(value, np.ndarray) and value.dtype.kind in "fiu":
        return ("array", value.shape, value.dtype.str)
    if value is None or isinstance(value, (bool, np.bool_, str)):
        return ("fixed", value)
    if isinstance(value, (int, np.integer)):
        return ("int",)
    if isinstance(value, (float, np.floating)):
        return ("scalar",)
    if isinstance(value, (tuple, list)):
        parts = tuple(value_layout(v) for v in value)
        return None if any(p is None for p in parts) else (type(value).__name__, parts)
    return None


def flatten_value(value: Any) -> np.ndarray:
    """Concatenate every number in ``value`` (depth first) into one float64 vector."""
    if isinstance(value, (tuple, list)):
        parts = [flatten_value(v) for v in value]
        return np.concatenate(parts) if parts else np.zeros(0)
    if value is None or isinstance(value, (bool, np.bool_, str)):
        return np.zeros(0)
    return np.asarray(value, dtype=np.float64).reshape(-1)


def unflatten_value(flat: np.ndarray, layout: Any) -> Any:
    """Inverse of :func:`flatten_value` for a value with structure ``layout``; its float64
    arrays are views into ``flat``."""
    value, used = _take(np.asarray(flat, dtype=np.float64), 0, layout)
    if used != len(flat):
        raise ValueError(f"flat value has {len(flat)} numbers but the layout uses {used}")
    return value


def _take(flat: np.ndarray, start: int, layout: Any) -> tuple[Any, int]:
    kind = layout[0]
    if kind == "array":
        size = math.prod(layout[1])
        part = flat[start : start + size].reshape(layout[1])
        dtype = np.dtype(layout[2])
        return (
            part if dtype == np.float64 else np.rint(part).astype(dtype) if dtype.kind in "iu" else part.astype(dtype)
        ), start + size
    if kind == "scalar":
        return float(flat[start]), start + 1
    if kind == "int":
        return int(round(flat[start])), start + 1
    if kind == "fixed":
        return layout[1], start
    items = []
    for part in layout[1]:
        item, start = _take(flat, start, part)
        items.append(item)
    return (tuple(items) if kind == "tuple" else items), start


def _size(layout: Any) -> int:
    kind = layout[0]
    if kind == "array":
        return math.prod(layout[1])
    if kind in ("scalar", "int"):
        return 1
    if kind == "fixed":
        return 0
    return sum(_size(part) for part in layout[1])


@dataclass(frozen=True)
class FoldPlan:
    """How a value crosses ranks as one summed vector: its ``layout``, and the positions of the
    numbers ``combine`` keeps instead of adding (``kept``: position and value, which must be
    the same on every rank)."""

    layout: Any
    kept: tuple

    @property
    def size(self) -> int:
        """How many numbers the flattened value has."""
        return _size(self.layout)

    def matches(self, flat: np.ndarray) -> bool:
        """Whether a value flattened to ``flat`` (with this layout) keeps the same fixed numbers."""
        return all(flat[i] == v for i, v in self.kept)

    def restore(self, summed: np.ndarray) -> Any:
        """The value from the rank-wise sum of flattened values: kept numbers put back."""
        if self.kept:
            summed = summed.copy()
            for i, v in self.kept:
                summed[i] = v
        return unflatten_value(summed, self.layout)


def fold_plan(value: Any, make_accumulator: Callable[[], Any]) -> FoldPlan | None:
    """A :class:`FoldPlan` for ``value``, or ``None`` when it must be gathered: not flattenable,
    or ``combine`` does something to a number other than add it or keep it."""
    layout = value_layout(value)
    if layout is None:
        return None
    flat = flatten_value(value)
    try:
        probe = make_accumulator()
        probe.from_value(copy.deepcopy(value))
        probe.combine(copy.deepcopy(value))
        combined = probe.value()
    except Exception:  # an accumulator that cannot combine a value with itself is gathered
        return None
    if value_layout(combined) != layout:
        return None
    doubled = flatten_value(combined)
    added = doubled == 2.0 * flat
    kept = (doubled == flat) & ~added
    if not np.all(added | kept):
        return None
    return FoldPlan(layout, tuple((int(i), float(flat[i])) for i in np.flatnonzero(kept)))
