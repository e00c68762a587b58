"""Distributed encoded-data handles, usable on ipyparallel engines or under plain torchrun."""
from .handle import EncodedDataHandle

__all__ = ["EncodedDataHandle"]
