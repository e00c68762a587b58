"""IPython magics: thin shells over :class:`~mixle_nb.cluster.MixleCluster` and the panels.

``%load_ext mixle_nb`` registers ``%mixle_cluster``, ``%mixle_push``, ``%mixle_scatter``,
``%mixle_pull`` and ``%%mixle``. Each has ``--help``; misuse raises IPython's ``UsageError``,
which the notebook shows as one line with the fix. A trailing ``# comment`` on a magic's line
is ignored, as Python ignores one.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TextIO

from IPython.core.error import UsageError
from IPython.core.magic import Magics, cell_magic, line_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring
from IPython.display import display

from . import cluster as cluster_module
from .cluster import BACKENDS, ClusterState, MixleCluster, RankDiedError, RankError
from .cluster.slurm import OPTIONS as SLURM_OPTIONS

if TYPE_CHECKING:
    from IPython.core.interactiveshell import InteractiveShell

STREAM_POLL_S = 0.1
OUTPUT_GRACE_S = 2.0  # a rank's last printed lines may arrive just after its answer


def running_cluster() -> MixleCluster:
    """The current cluster, or a ``UsageError`` that says how to start one."""
    cluster = cluster_module.current()
    if cluster is None or not cluster.state.has_processes:
        raise UsageError("no mixle cluster is running: start one with %mixle_cluster start N")
    return cluster


def usable_cluster() -> MixleCluster:
    """The current cluster if it can take work, or a ``UsageError`` that says how to recover."""
    cluster = running_cluster()
    if cluster.state is ClusterState.BROKEN:
        raise UsageError(f"the mixle cluster needs a restart ({cluster.broken_reason}): %mixle_cluster restart")
    return cluster


def parse_targets(text: str | None) -> list[int] | None:
    """``"0,2"`` or ``"1-3"`` → rank list (parsed, never evaluated)."""
    if text is None:
        return None
    ranks: list[int] = []
    try:
        for part in text.split(","):
            first, _, last = part.strip().partition("-")
            ranks.extend(range(int(first), int(last or first) + 1))
    except ValueError:
        raise UsageError(f"--targets takes ranks like 0,2 or 1-3; got {text!r}") from None
    return ranks


def run_cell(
    cluster: MixleCluster,
    code: str,
    targets: int | list[int] | None = None,
    all_ranks: bool = False,
    out: TextIO | None = None,
    err: TextIO | None = None,
) -> None:
    """Execute ``code`` on the ranks, streaming output while it runs: rank 0's (or the first
    target's) by default, every rank's labelled ``[rank r]`` with ``all_ranks``; what they
    write to stderr (warnings) goes to ``err``. Errors come back as :class:`RankError` naming
    the rank, with its traceback. An interrupt (Ctrl-C) stops every rank before it propagates."""
    streams = {"stdout": out or sys.stdout, "stderr": err or sys.stderr}
    call = cluster.execute_async(code, targets=targets)
    shown = call.ranks if all_ranks else call.ranks[:1]
    printed = {(name, r): 0 for name in streams for r in shown}

    def flush() -> None:
        for name, stream in streams.items():
            for rank, text in getattr(call, name).items():
                key = (name, rank)
                if key in printed and len(text) > printed[key]:
                    new = text[printed[key] :]
                    printed[key] = len(text)
                    if all_ranks:
                        new = "".join(f"[rank {rank}] {line}" for line in new.splitlines(keepends=True))
                    stream.write(new)
            stream.flush()

    try:
        while True:
            try:
                call.result(timeout=STREAM_POLL_S)
                return
            except TimeoutError:
                pass  # still running: show what arrived and wait again
            finally:
                if call.done():
                    call.wait_for_output(OUTPUT_GRACE_S)
                flush()
    except KeyboardInterrupt:
        if not call.cancelled():  # the interrupt arrived outside result(), e.g. while printing
            call.cancel()
        raise


def without_comment(line: str) -> str:
    """``line`` without a trailing comment: from a ``#`` outside quotes that starts a word."""
    quote = None
    for i, char in enumerate(line):
        if quote is not None:
            quote = None if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i].rstrip()
    return line


def activate(cluster: MixleCluster) -> None:
    """Make ipyparallel's own ``%px`` target this (started) cluster's engines too."""
    if cluster.view is None:
        raise UsageError("the mixle cluster has no engines to target: start it first")
    cluster.view.activate()


def parse(magic: Callable[..., Any], line: str) -> argparse.Namespace | None:
    """Parsed arguments, or ``None`` after printing the magic's usage for ``-h``/``--help``."""
    line = without_comment(line)
    if line.split()[:1] in (["-h"], ["--help"]):
        print(magic.__doc__)
        return None
    return parse_argstring(magic, line)


def defined_on_rank(name: str) -> bool:
    """Whether ``name`` is bound in this rank's namespace (runs on the engines)."""
    from .cluster.rank_side import rank_namespace

    return name in rank_namespace()


def missing_name_hint(cluster: MixleCluster, name: str, rank: int) -> str:
    """What to do when ``name`` is not defined on ``rank``: pull it from the ranks that have it,
    or push it when none has."""
    holders = [r for r, has in enumerate(cluster.run(defined_on_rank, name)) if has]
    if not holders:
        return f"{name!r} is not defined on rank {rank} nor on any other rank: push it with %mixle_push {name}"
    return (
        f"{name!r} is not defined on rank {rank}; ranks {holders} have it: pull it with "
        f"%mixle_pull {name} --rank {holders[0]}"
    )


@magics_class
class MixleMagics(Magics):
    """The mixle magics; each delegates to a function you can call without IPython."""

    @property
    def user_ns(self) -> dict[str, Any]:
        """The notebook's namespace (``%load_ext`` registers the magics with its shell)."""
        if self.shell is None:
            raise UsageError("the mixle magics need an IPython shell: %load_ext mixle_nb in a notebook")
        return self.shell.user_ns

    @line_magic
    @magic_arguments()
    @argument(
        "action", choices=["start", "stop", "status", "restart", "attach", "list"], help="what to do with the cluster"
    )
    @argument("n", nargs="?", type=int, help="number of engines (ranks), for start")
    @argument("--backend", default="auto", choices=BACKENDS, help="torch.distributed backend")
    @argument("--timeout", type=float, default=60.0, help="collective timeout in seconds")
    @argument("--launcher", default="local", help="ipyparallel engine launcher: local, mpi, ssh, slurm")
    @argument("--name", default="mixle", help="notebook variable the cluster is bound to")
    @argument("--detach", action="store_true", help="start: keep the cluster when the kernel dies")
    @argument("--id", default=None, help="attach: which detached cluster (see list)")
    @argument("--partition", help="slurm: sbatch --partition")
    @argument("--account", help="slurm: sbatch --account")
    @argument("--time", help="slurm: sbatch --time, e.g. 00:30:00")
    @argument("--nodes", type=int, help="slurm: sbatch --nodes")
    @argument("--ntasks-per-node", type=int, help="slurm: sbatch --ntasks-per-node")
    @argument("--gpus-per-task", type=int, help="slurm: sbatch --gpus-per-task")
    @argument(
        "--extra-sbatch",
        action="append",
        default=[],
        help="slurm: another sbatch option, e.g. --extra-sbatch=--qos=debug (repeatable)",
    )
    @argument("--pending-timeout", type=float, help="slurm: seconds start waits for the job to run")
    def mixle_cluster(self, line: str) -> None:
        """Start, stop, restart or show the mixle cluster.

        ``restart`` starts fresh engines (names defined on the ranks are gone: push and build
        them again); ``stop`` ends every process of the cluster, as a kernel shutdown does.

        Example::

            %mixle_cluster start 2          # 2 engines, one gloo group; binds `mixle`
            %mixle_cluster status

        ``start N --detach`` keeps the cluster when the kernel dies; in a new kernel
        ``%mixle_cluster list`` shows this user's detached clusters and ``%mixle_cluster attach``
        (``--id ID`` when there are several) reconnects to one and binds ``mixle``.
        ``start N --launcher slurm --partition p --time 00:30:00`` asks Slurm for the engines
        (``sbatch``'s own option names; see docs/guide/hosts-and-schedulers.md).
        """
        args = parse(self.mixle_cluster, line)
        if args is None:
            return
        if args.action == "start":
            if args.n is None:
                raise UsageError("say how many engines: %mixle_cluster start N (e.g. 4)")
            current = cluster_module.current()
            if current is not None and current.state.has_processes:
                raise UsageError("a mixle cluster is already running: %mixle_cluster stop (or restart) first")
            slurm = {k: getattr(args, k) for k in SLURM_OPTIONS if getattr(args, k) not in (None, [])}
            try:
                cluster = MixleCluster(
                    args.n,
                    backend=args.backend,
                    timeout=args.timeout,
                    launcher=args.launcher,
                    detached=args.detach,
                    **slurm,
                )
            except ValueError as exc:
                raise UsageError(str(exc)) from None
            cluster.start(progress=lambda message: print(message, flush=True))
            activate(cluster)
            self.user_ns[args.name] = cluster
            display(cluster.status())
        elif args.action == "stop":
            running_cluster().stop()
            print("mixle cluster stopped")
        elif args.action == "restart":
            cluster = running_cluster()
            cluster.restart(progress=lambda message: print(message, flush=True))
            activate(cluster)
            display(cluster.status())
        elif args.action == "attach":
            try:
                cluster = MixleCluster.attach(args.id)
            except LookupError as exc:
                raise UsageError(str(exc)) from None
            activate(cluster)
            self.user_ns[args.name] = cluster
            display(cluster.status())
        elif args.action == "list":
            records = MixleCluster.list_detached()
            print(
                "\n".join(
                    f"{r['cluster_id']}  {r['n']} engines ({r['launcher']})  detached by pid {r['detached_by']}"
                    for r in records
                )
                or "no detached mixle cluster is running"
            )
        else:
            display(running_cluster().status())

    def _user_value(self, name: str) -> Any:
        if name not in self.user_ns:
            raise UsageError(f"{name!r} is not defined in this notebook; define it before pushing it")
        return self.user_ns[name]

    @line_magic
    @magic_arguments()
    @argument("names", nargs="+", help="notebook variables to push")
    def mixle_push(self, line: str) -> None:
        """Push notebook variables to every rank under the same names.

        Example::

            offset, labels = 10, ["a", "b"]
            %mixle_push offset labels       # every rank gets both, under the same names
        """
        args = parse(self.mixle_push, line)
        if args is None:
            return
        usable_cluster().push(**{name: self._user_value(name) for name in args.names})

    @line_magic
    @magic_arguments()
    @argument("name", help="a notebook sequence; rank r gets name[r::n] under the same name")
    def mixle_scatter(self, line: str) -> None:
        """Shard a sequence by rank: rank r gets ``name[r::n]``, n the number of ranks.

        Build an EM handle on scattered data with ``TorchRunEncodedData.from_shards``, which
        keeps each rank's part whole (the constructor proper expects the full data on every
        rank, and would keep only ``part[rank::n]`` of it).

        Example::

            import numpy as np
            x = np.random.default_rng(0).normal(size=1000)
            %mixle_scatter x                # rank r gets x[r::n] as `x`
            %%mixle
            from mixle_nb.parallel import TorchRunEncodedData
            from mixle_nb.stats import GaussianEstimator
            hx = TorchRunEncodedData.from_shards(x, estimator=GaussianEstimator())
            print(len(hx))                  # 1000: every rank's part, whole
        """
        args = parse(self.mixle_scatter, line)
        if args is None:
            return
        usable_cluster().scatter(args.name, self._user_value(args.name))

    @line_magic
    @magic_arguments()
    @argument("name", help="variable on the ranks")
    @argument("--all", action="store_true", help="return a list with every rank's value")
    @argument("--rank", type=int, default=0, help="rank to pull from (default 0)")
    def mixle_pull(self, line: str) -> Any:
        """Pull a variable from rank 0 (or ``--rank R``, or ``--all`` ranks).

        Example::

            offset = 10
            %mixle_push offset
            value = %mixle_pull offset                 # rank 0's
            every = %mixle_pull offset --all           # [10, 10, ...], one per rank
            second = %mixle_pull offset --rank 1
        """
        args = parse(self.mixle_pull, line)
        if args is None:
            return
        cluster = usable_cluster()
        try:
            return cluster.pull(args.name, rank="all" if args.all else args.rank)
        except RankError as exc:
            if exc.ename == "NameError":
                raise UsageError(missing_name_hint(cluster, args.name, exc.rank)) from None
            raise
        except ValueError as exc:
            raise UsageError(str(exc)) from None

    @cell_magic
    @magic_arguments()
    @argument("--all", action="store_true", help="show every rank's output, labelled by rank")
    @argument("--targets", help="ranks to run on, e.g. 0,2 or 1-3 (default: all)")
    def mixle(self, line: str, cell: str) -> None:
        """Run the cell on every rank; only rank 0's output streams back (``--all``: every
        rank's, labelled; ``--targets``: the first target's). Errors name the rank.

        Example::

            %%mixle
            import torch.distributed as dist
            print(dist.get_rank(), dist.get_world_size())
        """
        args = parse(self.mixle, line)
        if args is None:
            return
        cluster = usable_cluster()
        try:
            run_cell(cluster, cell, targets=parse_targets(args.targets), all_ranks=args.all)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        except RankError as exc:
            print(f"--- rank {exc.rank} raised {exc.ename}: {exc.evalue} ---\n{exc.traceback_text}", file=sys.stderr)
            raise UsageError(f"the cell failed on rank {exc.rank} ({exc.ename}: {exc.evalue})") from None
        except RankDiedError as exc:
            raise UsageError(str(exc)) from None


def load_ipython_extension(ipython: InteractiveShell) -> None:
    ipython.register_magics(MixleMagics)
