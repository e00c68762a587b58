"""A local engine's entry point: the rank's imports first, then ipyparallel's engine unchanged.

Run as ``python -m mixle_nb.cluster.rank_engine`` with ipyparallel's engine arguments. The local
engines start beside the controller rather than after it (:mod:`.launch`): while the controller
comes up and writes its connection file, which the engine waits for, each engine imports torch,
``torch.distributed`` and the modules that join the group, so that registering, describing
itself and joining the group find them imported. Imported after registering, as before, torch
alone delayed the group by its whole import time (1.5-3 s here).

The engine's kernel imports ipykernel's debugger, which imports debugpy when it can (0.25 s of
CPU, an eighth of an engine's start): for the Jupyter debugger, which an ipyparallel engine has
no channel to serve. :func:`import_kernel_debugger` imports it with debugpy hidden, so it stays
off; ``import debugpy`` on an engine (to attach a debugger to a rank) still works.
"""

from __future__ import annotations

import sys

from .ipyparallel_internals import run_engine


def import_rank_modules() -> None:
    """Import what every rank needs before its first call: torch, ``torch.distributed`` and
    the modules of :func:`~mixle_nb.cluster.engine.describe` and ``form_group``."""
    import torch.distributed  # noqa: F401

    from ..parallel import group, severing  # noqa: F401
    from . import controller_watch, engine  # noqa: F401


def import_kernel_debugger() -> None:
    """Import ipykernel's debugger module with debugpy hidden (it then leaves the Jupyter
    debugger off), and let ``import debugpy`` work again afterwards."""
    if "debugpy" in sys.modules:  # imported already: nothing to save
        return
    sys.modules["debugpy"] = None  # type: ignore[assignment]  # "import debugpy" raises ImportError
    try:
        import ipykernel.debugger  # noqa: F401
    finally:
        del sys.modules["debugpy"]


def main() -> None:
    """Import the rank's modules, then run ipyparallel's engine with this process's arguments."""
    import_rank_modules()
    import_kernel_debugger()
    run_engine()


if __name__ == "__main__":
    main()
