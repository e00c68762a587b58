"""Argument checks shared by every public entry point: one rule and one message for each kind.

Integers are ``numbers.Integral`` (so ``np.int64`` passes) but never ``bool``; ``3.0`` is not an
integer. Reals are any ``numbers.Real`` except ``bool``, and must be finite.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from numbers import Integral, Real
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch


def integer(name: str, value: Any, *, minimum: int | None = 1) -> int:
    """``value`` as an ``int`` of at least ``minimum`` (``None``: any integer)."""
    if isinstance(value, bool) or not isinstance(value, Integral):
        raise ValueError(f"{name} must be an integer; got {value!r}")
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}; got {value!r}")
    return int(value)


def positive_int(name: str, value: Any) -> int:
    """``value`` as an ``int`` of at least 1."""
    return integer(name, value, minimum=1)


def optional_int(name: str, value: Any, *, minimum: int = 0) -> int | None:
    """``None``, or ``value`` as an ``int`` of at least ``minimum``."""
    return None if value is None else integer(name, value, minimum=minimum)


def real(
    name: str, value: Any, *, above: float | None = None, at_least: float | None = None, at_most: float | None = None
) -> float:
    """``value`` as a finite ``float`` within the given bounds."""
    if isinstance(value, bool) or not isinstance(value, Real) or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite real number; got {value!r}")
    bounds = [
        (above, lambda v, b: v > b, ">"),
        (at_least, lambda v, b: v >= b, ">="),
        (at_most, lambda v, b: v <= b, "<="),
    ]
    for bound, holds, sign in bounds:
        if bound is not None and not holds(value, bound):
            raise ValueError(f"{name} must be {sign} {bound}; got {value!r}")
    return float(value)


def positive_real(name: str, value: Any) -> float:
    """``value`` as a finite ``float`` > 0."""
    return real(name, value, above=0.0)


def non_negative_real(name: str, value: Any) -> float:
    """``value`` as a finite ``float`` >= 0."""
    return real(name, value, at_least=0.0)


def fraction(name: str, value: Any) -> float:
    """``value`` as a ``float`` in (0, 1]."""
    return real(name, value, above=0.0, at_most=1.0)


def choice(name: str, value: Any, options: Iterable[Any]) -> Any:
    """``value`` if it is one of ``options``."""
    options = tuple(options)
    if value not in options:
        raise ValueError(f"{name} must be one of {', '.join(map(repr, options))}; got {value!r}")
    return value


def device(name: str, value: Any) -> torch.device | None:
    """``None``, or ``value`` (a ``torch.device`` or its name) as a ``torch.device`` that this
    process can use: ``"cpu"``, or a CUDA device that exists here (``"cuda"`` names the
    current one)."""
    import torch  # here, not at the top: the other checks serve client code that needs no torch

    if value is None:
        return None
    if not isinstance(value, (str, torch.device)):
        raise ValueError(f"{name} must be a torch.device or its name ('cpu', 'cuda', 'cuda:1'); got {value!r}")
    try:
        parsed = torch.device(value)
    except RuntimeError:
        raise ValueError(f"{name} {value!r} is not a device name; use 'cpu', 'cuda' or 'cuda:N'") from None
    if parsed.type == "cpu":
        return torch.device("cpu")
    if parsed.type != "cuda":
        raise ValueError(f"{name} is {value!r}, but only 'cpu' and CUDA devices are supported")
    if not torch.cuda.is_available():
        raise ValueError(
            f"{name} is {value!r}, but CUDA is not available in this process "
            "(torch.cuda.is_available() is False): pass device='cpu' or None, or run where "
            "a GPU and a CUDA build of torch are installed"
        )
    index = torch.cuda.current_device() if parsed.index is None else parsed.index
    if index >= torch.cuda.device_count():
        raise ValueError(
            f"{name} is {value!r}, but this process sees {torch.cuda.device_count()} CUDA "
            f"device(s): pick one of cuda:0..cuda:{torch.cuda.device_count() - 1}"
        )
    return torch.device("cuda", index)
