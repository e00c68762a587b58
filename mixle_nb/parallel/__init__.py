"""Distributed encoded-data handles, usable on ipyparallel engines or under plain torchrun."""
from .handle import EncodedDataHandle
from .torch_neural import StreamingTokenEncodedData
from .torchrun import StepTimings, TorchRunEncodedData, torchrun_out

__all__ = ["EncodedDataHandle", "StepTimings", "StreamingTokenEncodedData", "TorchRunEncodedData", "torchrun_out"]
