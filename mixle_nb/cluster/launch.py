"""How a cluster's processes are launched: the launcher's options, checked before anything starts.

:class:`LaunchSpec` holds what :class:`~mixle_nb.cluster.MixleCluster` was given about its
processes: the ipyparallel engine launcher, its Slurm options (:mod:`.slurm`) or ``mpiexec``
options (:mod:`.mpi`), the controller's address and arguments, and any other
``ipyparallel.Cluster`` option by its trait name. Every name is checked: a misspelt keyword is a
``TypeError`` naming it and the valid ones (``ipyparallel.Cluster`` itself would only warn and
drop it), and a launcher's option given to another launcher is a ``ValueError``.
:meth:`LaunchSpec.cluster_arguments` turns the spec into ``ipyparallel.Cluster``'s arguments.
"""

from __future__ import annotations

import copy
import difflib
import logging
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from . import mpi
from .slurm import SlurmSpec

if TYPE_CHECKING:
    from traitlets.config import Config

# An engine's registration completes at the controller's first heartbeat after it (1-2 periods:
# ipyparallel's default 3000 ms made every start wait ~3-6 s, 500 ms still ~0.5-1 s). An engine
# is dropped after HEARTBEAT_MISSES + 1 missed pings: 5.5 s, as with 500 ms and ipyparallel's 10.
HEARTBEAT_MS = 100
HEARTBEAT_MISSES = 54
# Over TCP every ipyparallel socket authenticates its peers by the cluster's CurveZMQ key (made
# by the controller at each start, kept in its owner-only connection files): a peer without it is
# refused at the handshake instead of having its bytes parsed.
CURVE_ARGS = ("--IPController.enable_curve=True",)
# On one host the engines need neither a nanny (interrupts go by pid) nor a watch on the
# controller's heartbeat (the lifeline ends them with it): both would listen on loopback TCP.
LOCAL_ENGINE_ARGS = ("--IPEngine.enable_nanny=False", "--IPEngine.max_heartbeat_misses=0")
# On one host the engines start with the controller, not after it: each reads the controller's
# connection file (waiting for it up to this long) and imports torch meanwhile (.rank_engine).
CONNECTION_FILE_WAIT_S = 120.0
# The controller's command-line aliases (ipyparallel.controller.app's) for the settings the
# cluster or ipyparallel.Cluster put on its command line: "--ping=200" sets HeartMonitor.period.
CONTROLLER_ALIASES = {
    "ping": "HeartMonitor.period",
    "ip": "IPController.ip",
    "transport": "IPController.transport",
    "location": "IPController.location",
}
# ipyparallel.Cluster's options that it passes to the controller as a command-line setting
_CLUSTER_SETTINGS = {"controller_ip": "IPController.ip", "controller_location": "IPController.location"}
# ipyparallel.Cluster options that MixleCluster sets itself, and what to give instead
_RESERVED = {
    "n": "the number of engines is MixleCluster's first argument",
    "engines": "give the engine launcher as launcher=",
    "engine_launcher_class": "give the engine launcher as launcher=",
    "controller": "the cluster starts its own controller",
    "parent": "the cluster is not configurable through a parent",
    "log": "set log_level= instead",
}


def _cluster_traits() -> set[str]:
    """The options ``ipyparallel.Cluster`` accepts (its traits) that the cluster leaves to the caller."""
    import ipyparallel

    return set(ipyparallel.Cluster.class_trait_names()) - set(_RESERVED)


def check_ipyparallel_options(options: Mapping[str, Any], own: Iterable[str]) -> dict[str, Any]:
    """``options`` (``ipyparallel.Cluster`` traits by name) once each name is known to be one.

    Parameters
    ----------
    options : mapping
        The keyword arguments MixleCluster did not take itself.
    own : iterable of str
        MixleCluster's own keyword arguments, for the message.

    Returns
    -------
    dict
        A copy of ``options``.

    Raises
    ------
    TypeError
        A name that is neither MixleCluster's nor ``ipyparallel.Cluster``'s (a typo), or one
        MixleCluster sets itself; the message names it, a close match and the valid names.
    """
    if not options:
        return {}
    accepted = _cluster_traits()
    for name in options:
        if name in _RESERVED:
            raise TypeError(f"MixleCluster() does not take {name}=: {_RESERVED[name]}")
    unknown = sorted(set(options) - accepted)
    if unknown:
        valid = sorted(set(own) | accepted)
        hints = [
            repr(name) + (f" (did you mean {close[0]!r}?)" if (close := _close(name, valid)) else "")
            for name in unknown
        ]
        raise TypeError(
            f"MixleCluster() got unexpected keyword argument{'s' if len(unknown) > 1 else ''} "
            f"{', '.join(hints)}; its keyword arguments are {', '.join(valid)}"
        )
    return dict(options)


def _close(name: str, valid: Sequence[str]) -> list[str]:
    return difflib.get_close_matches(name, valid, n=1, cutoff=0.75)


def controller_setting(arg: str) -> str | None:
    """The setting (``"Class.trait"``) a controller argument like ``--Class.trait=value`` or
    ``--alias=value`` sets; None for a flag or a value (the ``"200"`` of ``["--ping", "200"]``)."""
    name = arg[2:].split("=", 1)[0] if arg.startswith("--") else ""
    if name in CONTROLLER_ALIASES:
        return CONTROLLER_ALIASES[name]
    return name if "." in name else None  # a flag (``--reuse``) may be given twice


def _checked_controller_args(args: tuple[str, ...], cluster_options: Mapping[str, Any]) -> tuple[str, ...]:
    """``args`` once no setting is given twice: the controller (traitlets) exits on a setting
    given twice, even with one value, so each is refused here, naming both arguments."""
    seen: dict[str, str] = {}
    for arg in args:
        setting = controller_setting(arg)
        if setting is None:
            continue
        if setting in seen:
            raise ValueError(
                f"controller_args set {setting} twice ({seen[setting]!r} and {arg!r}); the controller "
                "takes each setting once: keep one"
            )
        seen[setting] = arg
    for option, setting in _CLUSTER_SETTINGS.items():
        if cluster_options.get(option) and setting in seen:
            raise ValueError(
                f"{option}={cluster_options[option]!r} and controller_args' {seen[setting]!r} both set "
                f"{setting}; the controller takes it once: give {option}= or the argument, not both"
            )
    return args


def _strings(name: str, values: Any, example: str) -> tuple[str, ...]:
    if isinstance(values, str) or not all(isinstance(v, str) for v in values):
        raise ValueError(f"{name} must be a list of strings, e.g. {example}; got {values!r}")
    return tuple(values)


@dataclass(frozen=True)
class LaunchSpec:
    """A cluster's launcher and its options, checked.

    Attributes
    ----------
    launcher : str
        The ipyparallel engine launcher: "local", "mpi", "ssh", "slurm", ...
    slurm : SlurmSpec or None
        The batch job's ``sbatch`` options, for ``launcher="slurm"`` only.
    mpiexec_args : tuple of str or None
        Extra ``mpiexec`` options, for ``launcher="mpi"`` only.
    controller_ip : str or None
        The interface the controller listens on (``"*"``: every one).
    controller_args : tuple of str
        Extra command-line arguments of the controller (they win over the cluster's own).
    config : traitlets.config.Config or None
        ipyparallel's launcher configuration (the Slurm and MPI settings are added to it).
    ipyparallel_options : dict
        Other ``ipyparallel.Cluster`` options, by trait name.
    """

    launcher: str = "local"
    slurm: SlurmSpec | None = None
    mpiexec_args: tuple[str, ...] | None = None
    controller_ip: str | None = None
    controller_args: tuple[str, ...] = ()
    config: Config | None = None
    ipyparallel_options: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def build(
        cls,
        launcher: str,
        *,
        slurm_options: Mapping[str, Any],
        mpiexec_args: Sequence[str] | None,
        controller_ip: str | None,
        controller_args: Sequence[str],
        config: Config | None,
        ipyparallel_options: Mapping[str, Any],
        own: Iterable[str],
    ) -> LaunchSpec:
        """The checked spec; ``slurm_options`` maps each Slurm option to its value (None: not given).

        Raises
        ------
        TypeError
            An unknown keyword in ``ipyparallel_options`` (:func:`check_ipyparallel_options`).
        ValueError
            A malformed option, a launcher's option given to another launcher, or a controller
            setting given twice (in ``controller_args``, or there and as ``controller_ip``).
        """
        if not isinstance(launcher, str) or not launcher:
            raise ValueError(f"launcher must name an ipyparallel engine launcher, e.g. 'local'; got {launcher!r}")
        options = check_ipyparallel_options(ipyparallel_options, own)
        if controller_ip is not None and not isinstance(controller_ip, str):
            raise ValueError(f"controller_ip must be an address like '10.0.0.1' or '*'; got {controller_ip!r}")
        given = {name: value for name, value in slurm_options.items() if value is not None}
        checked_args = mpi.checked_mpiexec_args(launcher, mpiexec_args)
        own_controller_args = _checked_controller_args(
            _strings("controller_args", controller_args, "['--IPController.engine_ports=10101-10116']"),
            {**options, "controller_ip": controller_ip},
        )
        return cls(
            launcher=launcher,
            slurm=SlurmSpec.from_options(launcher, given),
            mpiexec_args=None if checked_args is None else tuple(checked_args),
            controller_ip=controller_ip,
            controller_args=own_controller_args,
            config=config,
            ipyparallel_options=options,
        )

    @property
    def given_settings(self) -> set[str]:
        """The controller settings (``"Class.trait"``) that :attr:`controller_args` set."""
        return {setting for arg in self.controller_args if (setting := controller_setting(arg))}

    @property
    def on_this_host(self) -> bool:
        """Whether every process runs on this host: the local launcher, with the controller
        left on its default address and transport (then they talk over Unix sockets,
        :meth:`cluster_arguments`)."""
        return (
            self.launcher == "local"
            and self.controller_ip is None
            and not {"controller_ip", "controller_location"} & set(self.ipyparallel_options)
            and not {"IPController.ip", "IPController.transport"} & self.given_settings
        )

    def cluster_arguments(self, n: int, batch_dir: str | None, socket_dir: str | None = None) -> dict[str, Any]:
        """``ipyparallel.Cluster``'s keyword arguments for ``n`` engines (the Slurm batch script
        goes in ``batch_dir``). The cluster's own controller settings (its heartbeat, CurveZMQ,
        the Unix sockets) are left out where the caller's ``controller_args`` set them: the
        controller exits on a setting given twice, so the caller's value is the one given.

        With ``socket_dir`` (a private folder; only when :attr:`on_this_host`), the controller,
        engines and client talk over Unix sockets in it instead of loopback TCP, and the engines
        start without a nanny or a heartbeat watch, which would each listen on loopback; they
        start at once, all together, beside the controller (not once its connection file is
        written), through :mod:`.rank_engine`, which imports torch while they wait. Without
        it, every socket uses CurveZMQ (:data:`CURVE_ARGS`) unless ``controller_args`` set
        ``--IPController.enable_curve`` themselves."""
        from traitlets.config import Config

        if socket_dir is None:
            sockets = list(CURVE_ARGS)
        else:
            sockets = ["--IPController.transport=ipc", f"--IPController.ip={socket_dir}/c"]
        own = [
            f"--HeartMonitor.period={HEARTBEAT_MS}",
            f"--HeartMonitor.max_heartmonitor_misses={HEARTBEAT_MISSES}",
            *sockets,
        ]
        given = self.given_settings
        arguments: dict[str, Any] = {
            "log_level": logging.WARNING,
            "shutdown_atexit": False,  # the lifeline ends the cluster at exit
            **self.ipyparallel_options,
            "engines": self.launcher,
            "controller_args": [
                *(arg for arg in own if controller_setting(arg) not in given),
                *self.controller_args,
            ],
        }
        if self.controller_ip is not None:
            arguments["controller_ip"] = self.controller_ip
        config = arguments["config"] = self.config if self.config is not None else Config()
        if socket_dir is not None:
            config = arguments["config"] = copy.deepcopy(config)  # each start adds to a fresh copy
            config.LocalControllerLauncher.controller_cmd = [sys.executable, "-m", "mixle_nb.cluster.ipc_controller"]
            engines = config.LocalEngineSetLauncher
            engine_args = list(engines.get("engine_args", []))
            wait = f"--IPEngine.wait_for_url_file={CONNECTION_FILE_WAIT_S:g}"
            engines.engine_args = [*LOCAL_ENGINE_ARGS, wait, *engine_args]
            engines.engine_cmd = [sys.executable, "-m", "mixle_nb.cluster.rank_engine"]
            engines.setdefault("delay", 0.0)  # ipyparallel sleeps 0.1 s between engines otherwise
            arguments["send_engines_connection_env"] = False  # the file, so no wait for the controller
        if self.slurm is not None:
            if batch_dir is None:
                raise ValueError("a Slurm cluster's batch script needs a folder (batch_dir)")
            self.slurm.configure(config, n, batch_dir)
            # the compute nodes must reach the controller: every interface unless told which
            if "IPController.ip" not in given:
                arguments.setdefault("controller_ip", "*")
        if self.mpiexec_args is not None:
            mpi.configure(config, list(self.mpiexec_args))
        return arguments
