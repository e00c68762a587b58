"""mixle_nb: distributed EM and streaming neural training, driven from Jupyter."""

__version__ = "0.1.0"


def load_ipython_extension(ipython):
    """``%load_ext mixle_nb``: register the mixle magics."""
    from .magics import load_ipython_extension as _load

    _load(ipython)
