"""A local engine's entry point: the rank's imports first, then ipyparallel's engine unchanged.

Run as ``python -m mixle_nb.cluster.rank_engine`` with ipyparallel's engine arguments. The local
engines start beside the controller rather than after it (:mod:`.launch`): while the controller
comes up and writes its connection file, which the engine waits for, each engine imports torch,
``torch.distributed`` and the modules that join the group, so that registering, describing
itself and joining the group find them imported. Imported after registering, as before, torch
alone delayed the group by its whole import time (1.5-3 s here).
"""

from __future__ import annotations

from .ipyparallel_internals import run_engine


def import_rank_modules() -> None:
    """Import what every rank needs before its first call: torch, ``torch.distributed`` and
    the modules of :func:`~mixle_nb.cluster.engine.describe` and ``form_group``."""
    import torch.distributed  # noqa: F401

    from ..parallel import group, severing  # noqa: F401
    from . import controller_watch, engine  # noqa: F401


def main() -> None:
    """Import the rank's modules, then run ipyparallel's engine with this process's arguments."""
    import_rank_modules()
    run_engine()


if __name__ == "__main__":
    main()
