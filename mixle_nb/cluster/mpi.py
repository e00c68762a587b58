"""MPI: a MixleCluster's engines as one ``mpiexec`` of ``n`` processes, through ipyparallel's
``MPIEngineSetLauncher``.

Each engine asks the controller for engine id = its MPI rank, read from the variable the
launcher sets (Open MPI's ``OMPI_COMM_WORLD_RANK``, or ``PMI_RANK`` under MPICH's Hydra), so
rank r of the torch group is MPI rank r. The engines never initialize MPI themselves (no
mpi4py needed; ipyparallel's own ``--mpi`` mode is turned off again): the torch group is still
gloo or nccl, formed by the cluster as for any launcher.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from traitlets.config import Config

# the engine command, run by mpiexec: exec the engine with the id the MPI launcher gave it
_WITH_MPI_RANK = [
    "sh",
    "-c",
    'exec "$0" "$@" --IPEngine.use_mpi=False --IPEngine.id="${OMPI_COMM_WORLD_RANK:-$PMI_RANK}"',
]


def checked_mpiexec_args(launcher: str, args: Sequence[str] | None) -> list[str] | None:
    """``args`` (extra ``mpiexec`` options) as a list for ``launcher="mpi"`` (``[]`` when None),
    else None.

    Raises
    ------
    ValueError
        ``args`` given to another launcher, or not a list of strings.
    """
    if launcher != "mpi":
        if args is not None:
            raise ValueError(f"mpiexec_args= needs launcher='mpi' (launcher is {launcher!r})")
        return None
    args = [] if args is None else args
    if isinstance(args, str) or not all(isinstance(a, str) for a in args):
        raise ValueError(
            "mpiexec_args must be a list of mpiexec options, e.g. "
            f"['--oversubscribe', '--hostfile', 'hosts']; got {args!r}"
        )
    return list(args)


def configure(config: Config, mpiexec_args: list[str]) -> None:
    """Set ``MPIEngineSetLauncher`` in the traitlets ``config``: the engines take their MPI
    rank as engine id; ``mpiexec_args`` go to ``mpiexec`` before the program."""
    config.MPIEngineSetLauncher.mpi_args = list(mpiexec_args)
    config.MPIEngineSetLauncher.engine_cmd = _WITH_MPI_RANK + [sys.executable, "-m", "ipyparallel.engine"]
