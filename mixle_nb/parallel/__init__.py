"""Distributed encoded-data handles, usable on ipyparallel engines or under plain torchrun.

The public names are imported on first use (a module ``__getattr__``): an engine joining its
cluster's group imports :mod:`.group` alone, not the handles and the neural modules behind them.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..stats.handle import EncodedDataHandle
    from .em_handle import StepTimings, TorchRunEncodedData
    from .fail_together import PeerRankError
    from .group import GroupMembership, join_group, torchrun_out
    from .token_handle import StreamingTokenEncodedData

# each public name and the module (relative to this package) that defines it
_HOMES = {
    "EncodedDataHandle": "..stats.handle",
    "GroupMembership": ".group",
    "join_group": ".group",
    "PeerRankError": ".fail_together",
    "StepTimings": ".em_handle",
    "StreamingTokenEncodedData": ".token_handle",
    "TorchRunEncodedData": ".em_handle",
    "torchrun_out": ".group",
}

__all__ = [
    "EncodedDataHandle",
    "GroupMembership",
    "join_group",
    "PeerRankError",
    "StepTimings",
    "StreamingTokenEncodedData",
    "TorchRunEncodedData",
    "torchrun_out",
]


def __getattr__(name: str) -> Any:
    """A public name, imported from its module on first use."""
    if name not in _HOMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_HOMES[name], __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    """The module's names, the public ones not yet imported included."""
    return sorted(set(globals()) | set(__all__))
