"""mixle_nb: distributed EM and streaming neural training, driven from Jupyter."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from IPython.core.interactiveshell import InteractiveShell

__version__ = "0.1.0"


def load_ipython_extension(ipython: InteractiveShell) -> None:
    """``%load_ext mixle_nb``: register the mixle magics."""
    from .magics import load_ipython_extension as _load

    _load(ipython)
