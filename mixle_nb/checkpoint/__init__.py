"""Checkpoints, so that long work survives the death of the notebook or of a rank.

``atomic`` (a file replaced whole or not at all), ``em`` (an EM run's model and history, for
``fit`` and ``EMPanel``), ``training`` (the streaming handle's module, optimizer, data position
and RNG through ``torch.distributed.checkpoint``).
"""

from .atomic import write_atomically
from .em import EMCheckpoint

__all__ = ["EMCheckpoint", "write_atomically"]
