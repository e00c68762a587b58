"""The controller's command line: a setting the caller gives in ``controller_args`` replaces the
cluster's own (the controller, through traitlets, exits on a setting given twice, even an
alias and its full name: "period only accepts one value, got 2"), and a setting the caller
gives twice is refused before anything starts. The arguments are parsed by ipyparallel's own
controller application, as the controller process parses them; one real cluster starts with an
override."""

from __future__ import annotations

import pytest
from rank_functions import allreduce_sum
from traitlets.config import Config

from mixle_nb.cluster import MixleCluster
from mixle_nb.cluster.launch import CONTROLLER_ALIASES, HEARTBEAT_MS


def controller_config(cluster: MixleCluster, tmp_path, *, sockets: bool) -> Config:
    """The controller's configuration from the command line ipyparallel.Cluster would give it:
    ``--ip=`` for ``controller_ip``, then the cluster's ``controller_args``."""
    from ipyparallel.controller.app import IPController

    arguments = cluster.launch_spec.cluster_arguments(cluster.n, str(tmp_path), str(tmp_path) if sockets else None)
    argv = [f"--ip={arguments['controller_ip']}"] if arguments.get("controller_ip") else []
    app = IPController()
    app.parse_command_line([*argv, *arguments["controller_args"]])  # SystemExit on a setting given twice
    return app.config


# (the cluster's options, a setting the caller's controller_args give, the value it must have)
OVERRIDES = [
    ({}, "--HeartMonitor.period=200", ("HeartMonitor", "period", 200)),
    ({}, "--ping=250", ("HeartMonitor", "period", 250)),
    ({}, "--HeartMonitor.max_heartmonitor_misses=9", ("HeartMonitor", "max_heartmonitor_misses", 9)),
    (
        {"launcher": "ssh", "controller_ip": "10.0.0.1"},
        "--IPController.enable_curve=False",
        ("IPController", "enable_curve", False),
    ),
    ({}, "--IPController.ip=127.0.0.1", ("IPController", "ip", "127.0.0.1")),
    ({"launcher": "slurm"}, "--ip=10.0.0.7", ("IPController", "ip", "10.0.0.7")),
]


@pytest.mark.parametrize(("options", "arg", "expected"), OVERRIDES, ids=[o[1] for o in OVERRIDES])
def test_the_callers_controller_setting_replaces_the_clusters_own(tmp_path, options, arg, expected):
    cluster = MixleCluster(2, controller_args=[arg], **options)
    sockets = cluster.launch_spec.on_this_host
    section, trait, value = expected
    assert controller_config(cluster, tmp_path, sockets=sockets)[section][trait] == value


def test_the_clusters_own_settings_stay_where_the_caller_gives_others(tmp_path):
    cluster = MixleCluster(2, controller_args=["--IPController.engine_ports=10101-10116"])
    config = controller_config(cluster, tmp_path, sockets=True)
    assert config.HeartMonitor.period == HEARTBEAT_MS
    assert config.IPController.transport == "ipc" and config.IPController.engine_ports == list(range(10101, 10117))


def test_an_address_in_controller_args_leaves_the_unix_sockets_for_curve_over_tcp():
    spec = MixleCluster(2, controller_args=["--IPController.ip=127.0.0.1"]).launch_spec
    assert not spec.on_this_host
    assert "--IPController.enable_curve=True" in spec.cluster_arguments(2, None)["controller_args"]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (
            {"controller_args": ["--ping=200", "--HeartMonitor.period=300"]},
            r"controller_args set HeartMonitor\.period twice \('--ping=200' and '--HeartMonitor\.period=300'\)",
        ),
        (
            {"controller_args": ["--IPController.ip", "10.0.0.2", "--ip=10.0.0.3"]},
            r"set IPController\.ip twice",
        ),
        (
            {"launcher": "ssh", "controller_ip": "10.0.0.1", "controller_args": ["--IPController.ip=10.0.0.2"]},
            r"controller_ip='10\.0\.0\.1' and controller_args' '--IPController\.ip=10\.0\.0\.2' both set "
            r"IPController\.ip.*not both",
        ),
        (
            {"controller_location": "head", "controller_args": ["--location=node1"]},
            r"controller_location='head' and controller_args' '--location=node1' both set IPController\.location",
        ),
    ],
)
def test_a_controller_setting_given_twice_is_refused_before_anything_starts(options, message):
    with pytest.raises(ValueError, match=message):
        MixleCluster(2, **options)


def test_the_aliases_are_ipyparallels():
    from ipyparallel.controller.app import IPController

    aliases = dict(IPController().aliases)
    for alias, setting in CONTROLLER_ALIASES.items():
        target = aliases[alias][0] if isinstance(aliases[alias], tuple) else aliases[alias]
        assert target == setting, alias


@pytest.mark.cluster
def test_a_cluster_whose_controller_args_set_its_heartbeat_starts_and_runs():
    with MixleCluster(1, timeout=20.0, controller_args=["--HeartMonitor.period=200"]) as cluster:
        assert cluster.run(allreduce_sum, 3) == [3.0]
