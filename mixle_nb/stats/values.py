"""Flat codec for accumulator values, so a distributed fold can add them as one tensor.

A value is flattenable when it is built only from float arrays/scalars, tuples and lists
(every numeric family and mixtures of them). Dicts (categorical counts) are not: their keys
differ by shard, so those values are folded by gathering instead.
"""
from __future__ import annotations

import math
from typing import Any, Optional

import numpy as np


def value_layout(value: Any) -> Optional[Any]:
    """A hashable description of ``value``'s structure, or ``None`` if it cannot be flattened."""
    if isinstance(value, np.ndarray) and value.dtype.kind in "fiu":
        return ("array", value.shape)
    if isinstance(value, (float, int, np.floating, np.integer)) and not isinstance(value, bool):
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
    return np.asarray(value, dtype=np.float64).reshape(-1)


def unflatten_value(flat: np.ndarray, layout: Any) -> Any:
    """Inverse of :func:`flatten_value` for a value with structure ``layout``; its arrays are
    views into ``flat``."""
    value, used = _take(np.asarray(flat, dtype=np.float64), 0, layout)
    if used != len(flat):
        raise ValueError(f"flat value has {len(flat)} numbers but the layout uses {used}")
    return value


def _take(flat: np.ndarray, start: int, layout: Any):
    kind = layout[0]
    if kind == "array":
        size = math.prod(layout[1])
        return flat[start : start + size].reshape(layout[1]), start + size
    if kind == "scalar":
        return float(flat[start]), start + 1
    items = []
    for part in layout[1]:
        item, start = _take(flat, start, part)
        items.append(item)
    return (tuple(items) if kind == "tuple" else items), start
