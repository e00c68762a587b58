"""Distributed encoded-data handles, usable on ipyparallel engines or under plain torchrun."""

from .fail_together import PeerRankError
from .group import GroupMembership, join_group
from .handle import EncodedDataHandle
from .torch_neural import StreamingTokenEncodedData
from .torchrun import StepTimings, TorchRunEncodedData, torchrun_out

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
