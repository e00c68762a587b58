"""The fast tier's guard (``make check``): which tests start processes, and what refuses them.

Every test that starts processes carries the marker of what it starts (pyproject.toml lists them):
``cluster`` (a MixleCluster / ipyparallel), ``kernel`` (a Jupyter kernel: nbclient, jupyter_client,
a JupyterLab server), ``ranks`` (torch.distributed ranks in subprocesses: ``run_local``, torchrun,
a script that runs them), ``subprocess`` (any other Python program: another package's test
suite), ``browser``, ``multihost``, ``mpi``, ``slurm``, ``hub`` (a JupyterHub). ``make check`` deselects
them all; in such a run (:func:`starts_nothing`), :class:`Guard` makes starting any of them raise,
naming the missing marker, so a test that starts something without its marker fails the fast
tier instead of slowing it down unnoticed. tests/conftest.py installs it. A run that deselects
only some kinds (``make test``'s two lanes) is not guarded: there a test selected by one marker
may start processes of another kind (a ``multihost`` test starts a cluster on its hosts).
"""

from __future__ import annotations

import multiprocessing.process
import os
import subprocess
import sys

import pytest

# The markers of tests that start processes; every one of them is deselected by `make check`.
PROCESS_MARKERS = ("cluster", "kernel", "ranks", "subprocess", "browser", "multihost", "mpi", "slurm", "hub")

# Session fixtures that start something, and the marker a test using them needs.
FIXTURE_MARKERS = {
    "cluster2": "cluster",
    "notebook_runs": "kernel",
    "em_cluster": "cluster",
    "ssh_cluster": "multihost",
    "network": "multihost",
    "lab": "browser",
    "browser": "browser",
}

# Executables whose start means a process-starting test: Python (engines, controllers, kernels,
# ranks, JupyterLab), shells running such scripts, and the launchers of the other kinds.
STARTERS = {
    "bash": "ranks",
    "torchrun": "ranks",
    "ipcontroller": "cluster",
    "ipengine": "cluster",
    "ipcluster": "cluster",
    "jupyter": "kernel",
    "jupyter-lab": "kernel",
    "chromium": "browser",
    "node": "browser",
    "mpiexec": "mpi",
    "mpirun": "mpi",
    "srun": "slurm",
    "sbatch": "slurm",
    "sshd": "multihost",
    "ssh": "multihost",
    "ip": "multihost",
    "jupyterhub": "hub",
    "configurable-http-proxy": "hub",
    "useradd": "hub",
}


def starter_kind(args) -> str | None:
    """The marker a ``Popen(args)`` needs, or None for an ordinary helper tool (git, ldconfig)."""
    argv = [args] if isinstance(args, (str, bytes, os.PathLike)) else list(args or [])
    if not argv:
        return None
    name = os.path.basename(os.fsdecode(argv[0])).split()[0] if argv else ""
    if name == os.path.basename(sys.executable) or name.startswith("python"):
        return "ranks, cluster, kernel or subprocess: whichever this Python process is"
    return STARTERS.get(name)


class Guard:
    """In a run that deselects some process markers, starting such a process raises.

    Installed for the whole session (conftests ``pytest_configure``), not per test: module and session
    fixtures (a cluster, a smoke run) start before any function-scoped fixture could patch.
    """

    def __init__(self, guarded: tuple[str, ...]) -> None:
        self.guarded = guarded
        self.test = "collection"
        self._undo: list[tuple[object, str, object]] = []

    def refuse(self, what: str, kind: str) -> None:
        raise RuntimeError(
            f"{self.test} started {what} in a run that deselects {', '.join(self.guarded)} "
            f"(the fast tier, `make check`): mark the test with what it starts ({kind}), "
            f"e.g. @pytest.mark.{kind.split(',')[0].split(':')[0]}, so that only `make test` runs it"
        )

    def _patch(self, owner: object, name: str, replacement: object) -> None:
        self._undo.append((owner, name, getattr(owner, name)))
        setattr(owner, name, replacement)

    def install(self) -> None:
        guard = self
        popen_init = subprocess.Popen.__init__

        def guarded_popen_init(popen, args, *rest, **kwargs):
            kind = starter_kind(args)
            if kind is not None:
                guard.refuse(f"the process {args!r}", kind)
            popen_init(popen, args, *rest, **kwargs)

        def guarded_process_start(process):
            guard.refuse(f"the multiprocessing child {process.name} (run_local's ranks?)", "ranks")

        def guarded_cluster_start(cluster, *args, **kwargs):
            guard.refuse("a MixleCluster", "cluster")

        self._patch(subprocess.Popen, "__init__", guarded_popen_init)
        self._patch(multiprocessing.process.BaseProcess, "start", guarded_process_start)
        from mixle_nb.cluster import MixleCluster

        self._patch(MixleCluster, "start", guarded_cluster_start)
        try:  # nbclient and jupyter_client start every kernel through the local provisioner
            from jupyter_client.provisioning.local_provisioner import LocalProvisioner
        except ImportError:
            return

        async def guarded_launch_kernel(provisioner, cmd, **kwargs):
            guard.refuse(f"a Jupyter kernel {cmd!r}", "kernel")

        self._patch(LocalProvisioner, "launch_kernel", guarded_launch_kernel)

    def uninstall(self) -> None:
        while self._undo:
            owner, name, original = self._undo.pop()
            setattr(owner, name, original)


def deselected_markers(config: pytest.Config) -> tuple[str, ...]:
    """The process markers that the run's ``-m`` expression deselects."""
    expression = config.getoption("markexpr", "")
    if not expression:
        return ()
    from _pytest.mark.expression import Expression

    compiled = Expression.compile(expression)
    return tuple(m for m in PROCESS_MARKERS if not compiled.evaluate(lambda name, /, **kw: name == m))


def starts_nothing(config: pytest.Config) -> bool:
    """Whether the run's ``-m`` deselects every process marker (the fast tier, ``make check``)."""
    return set(deselected_markers(config)) == set(PROCESS_MARKERS)
