"""mixle_nb: distributed EM and streaming neural training, driven from Jupyter."""

from __future__ import annotations

from importlib.metadata import version
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from IPython.core.interactiveshell import InteractiveShell

__version__ = version("mixle_nb")  # the one source is pyproject.toml's [project] version


def load_ipython_extension(ipython: InteractiveShell) -> None:
    """``%load_ext mixle_nb``: register the mixle magics."""
    from .magics import load_ipython_extension as _load

    _load(ipython)
