"""A package's public names imported from their modules on first use (a module ``__getattr__``),
so that a process imports only what it runs (an engine does not import the notebook's side)."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any


def lazy_names(package: str, homes: dict[str, str], namespace: dict[str, Any]) -> tuple[Callable, Callable]:
    """The ``__getattr__`` and ``__dir__`` of ``package``, whose public names ``homes`` maps to
    the modules (relative to it) that define them; ``namespace`` is its ``globals()``."""

    def __getattr__(name: str) -> Any:
        """A public name, imported from its module on first use."""
        if name not in homes:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(homes[name], package), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        """The module's names, the public ones not yet imported included."""
        return sorted(set(namespace) | set(namespace.get("__all__", ())))

    return __getattr__, __dir__
