"""Distributed encoded-data handles, usable on ipyparallel engines or under plain torchrun.

The public names are imported on first use (a module ``__getattr__``): an engine joining its
cluster's group imports :mod:`.group` alone, not the handles and the neural modules behind them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..lazy_names import lazy_names

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


__getattr__, __dir__ = lazy_names(__name__, _HOMES, globals())
