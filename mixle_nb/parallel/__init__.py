"""Distributed encoded-data handles, usable on ipyparallel engines or under plain torchrun."""

from ..stats.handle import EncodedDataHandle
from .em_handle import StepTimings, TorchRunEncodedData
from .fail_together import PeerRankError
from .group import GroupMembership, join_group, torchrun_out
from .token_handle import StreamingTokenEncodedData

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
