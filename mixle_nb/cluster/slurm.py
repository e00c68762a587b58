"""Slurm: a MixleCluster's engines as one batch job, through ipyparallel's ``SlurmEngineSetLauncher``.

:class:`SlurmSpec` holds the job's ``sbatch`` options (spelled as ``sbatch`` spells them, with
``_`` for ``-``) and writes the batch template ipyparallel fills in: one ``srun`` step of ``n``
tasks, each an engine that asks the controller for engine id ``$SLURM_PROCID`` (so rank r is
Slurm's task r). :class:`SlurmJob` follows the submitted job through ``squeue``: how long it
pends and why, the state it ended in, and ``scancel`` at stop.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .. import validation

if TYPE_CHECKING:
    from traitlets.config import Config

OPTIONS = (
    "partition",
    "account",
    "time",
    "nodes",
    "ntasks_per_node",
    "gpus_per_task",
    "extra_sbatch",
    "pending_timeout",
)
PENDING_TIMEOUT_S = 300.0
POLL_S = 0.5
ENDED_POLL_S = 1.0
FINAL_STATE_WAIT_S = 3.0  # liveness: how often a call in progress asks squeue whether the job ended
CANCEL_WAIT_S = 30.0  # scancel -> the job has left squeue (KillWait and the epilog)
# squeue's states once a job has ended (it stays listed for MinJobAge with -t all)
ENDED = {
    "CANCELLED",
    "COMPLETED",
    "FAILED",
    "TIMEOUT",
    "NODE_FAIL",
    "PREEMPTED",
    "BOOT_FAIL",
    "DEADLINE",
    "OUT_OF_MEMORY",
    "REVOKED",
    "SPECIAL_EXIT",
}
# what the commonest pending reasons mean for the user (squeue's %r)
REASONS = {
    "Resources": "the nodes or CPUs it asks for are busy",
    "Priority": "jobs of higher priority are ahead of it",
    "PartitionNodeLimit": "it asks for more nodes than the partition allows",
    "PartitionTimeLimit": "its --time is longer than the partition allows",
    "PartitionDown": "the partition is down",
    "ReqNodeNotAvail": "a node it needs is down, drained or reserved",
    "AssocGrpCpuLimit": "the account's CPU limit is reached",
    "QOSMaxJobsPerUserLimit": "the QOS's per-user job limit is reached",
}
# one srun step; each task execs the engine with the engine id Slurm gave it
_SRUN = 'srun sh -c \'exec "$0" "$@" --IPEngine.id="$SLURM_PROCID"\' {program_and_args}\n'


def _escape(text: str) -> str:
    """``text`` as a literal in ipyparallel's template (its formatter reads braces)."""
    return text.replace("{", "{{").replace("}", "}}")


@dataclass(frozen=True)
class SlurmSpec:
    """The ``sbatch`` options of a cluster's job; ``pending_timeout`` (s): how long ``start()``
    waits for the job to run before it cancels it and raises."""

    partition: str | None = None
    account: str | None = None
    time: str | None = None
    nodes: int | None = None
    ntasks_per_node: int | None = None
    gpus_per_task: int | None = None
    extra_sbatch: tuple[str, ...] = ()
    pending_timeout: float = PENDING_TIMEOUT_S

    @classmethod
    def from_options(cls, launcher: str, options: Mapping[str, Any]) -> SlurmSpec | None:
        """The spec of ``options`` (Slurm options by name, those given) for ``launcher="slurm"``,
        else None.

        Raises
        ------
        TypeError
            A name in ``options`` that is no Slurm option (one of :data:`OPTIONS`).
        ValueError
            A Slurm option given to another launcher, or a malformed one.
        """
        unknown = sorted(set(options) - set(OPTIONS))
        if unknown:
            raise TypeError(f"unknown Slurm options {unknown}; they are {', '.join(OPTIONS)}")
        given = {k: options[k] for k in OPTIONS if k in options}
        if launcher != "slurm":
            if given:
                raise ValueError(
                    f"{', '.join(f'{k}=' for k in given)} need launcher='slurm' (launcher is {launcher!r})"
                )
            return None
        for name in ("nodes", "ntasks_per_node", "gpus_per_task"):
            if given.get(name) is not None:
                given[name] = validation.positive_int(name, given[name])
        for name in ("partition", "account", "time"):
            value = given.get(name)
            if value is not None and (not isinstance(value, str) or not value.strip()):
                raise ValueError(f"{name} must be a non-empty string like sbatch's --{name}; got {value!r}")
        extra = given.get("extra_sbatch", ())
        if isinstance(extra, str) or not all(isinstance(o, str) and o.startswith("-") for o in extra):
            raise ValueError(
                "extra_sbatch must be a list of sbatch options, e.g. "
                f"['--qos=debug', '--mem-per-cpu=2G']; got {extra!r}"
            )
        given["extra_sbatch"] = tuple(extra)
        if "pending_timeout" in given:
            given["pending_timeout"] = validation.positive_real("pending_timeout", given["pending_timeout"])
        return cls(**given)

    def sbatch_options(self, n: int) -> list[str]:
        """The job's ``#SBATCH`` options for ``n`` engines."""
        options = [f"--ntasks={n}", "--export=ALL"]
        for name in ("partition", "account", "time", "nodes", "ntasks_per_node", "gpus_per_task"):
            value = getattr(self, name)
            if value is not None:
                options.append(f"--{name.replace('_', '-')}={value}")
        return options + list(self.extra_sbatch)

    def batch_template(self, n: int) -> str:
        """ipyparallel's batch template: the options, then one ``srun`` step of the engines."""
        lines = ["#!/bin/sh", "#SBATCH --job-name=mixle-{cluster_id}", "#SBATCH --output={output_file}"]
        lines += [f"#SBATCH {_escape(o)}" for o in self.sbatch_options(n)]
        return "\n".join(lines) + "\n" + _SRUN

    def configure(self, config: Config, n: int, batch_dir: str) -> None:
        """Set ``SlurmEngineSetLauncher`` in the traitlets ``config`` for ``n`` engines; the
        batch script is written in ``batch_dir`` (ipyparallel's default is the working directory)."""
        launcher = config.SlurmEngineSetLauncher
        launcher.batch_template = self.batch_template(n)
        launcher.batch_file_name = os.path.join(batch_dir, "engines.sbatch")
        # a job that already ended is no error at stop
        launcher.delete_command = ["scancel", "--quiet"]
        launcher.signal_command = ["scancel", "--quiet", "-s"]


def _squeue(*args: str) -> subprocess.CompletedProcess | None:
    """``squeue``'s answer; None when it did not answer in time (slurmctld busy or away)."""
    try:
        return subprocess.run(["squeue", "-h", *args], capture_output=True, text=True, timeout=30)
    except subprocess.TimeoutExpired:
        return None


@dataclass
class SlurmJob:
    """A submitted job, seen through ``squeue``."""

    job_id: str
    _ended_seen: tuple[float, bool] = (0.0, False)  # (when squeue was last asked, its answer)

    def ended(self, max_age_s: float = ENDED_POLL_S) -> bool:
        """Whether the job has ended (cancelled, failed, out of time, its node down): its
        engines are gone or going. Asks ``squeue`` at most every ``max_age_s``."""
        asked_at, ended = self._ended_seen
        if not ended and time.monotonic() - asked_at >= max_age_s:
            state = self.state()[0]
            ended = state in ENDED or state in ("COMPLETING", "GONE")
            self._ended_seen = (time.monotonic(), ended)
        return ended

    def state(self) -> tuple[str, str]:
        """(state, reason) as ``squeue`` has them; ("GONE", "") once Slurm forgot the job,
        ("UNKNOWN", why) when ``squeue`` failed (that alone never counts as the job's end)."""
        done = _squeue("-j", self.job_id, "-t", "all", "-o", "%T|%r")
        if done is None:
            return "UNKNOWN", "squeue did not answer"
        line = done.stdout.strip().splitlines()
        if done.returncode != 0 and "Invalid job id" not in done.stderr:
            return "UNKNOWN", (done.stderr.strip().splitlines() or ["squeue failed"])[0]
        if not line:
            return "GONE", ""
        state, _, reason = line[0].partition("|")
        return state.strip(), "" if reason.strip() == "None" else reason.strip()

    def describe(self) -> str:
        """One line for the status table: ``slurm job 17: PENDING (Resources: ...)``."""
        state, reason = self.state()
        return f"slurm job {self.job_id}: {state}" + (f" ({_explain(reason)})" if reason else "")

    def final_state(self, wait_s: float = FINAL_STATE_WAIT_S) -> str:
        """The state the job ended in, waiting ``wait_s`` for one that is still completing
        (Slurm shows why a job ended only once its processes are gone)."""
        deadline = time.monotonic() + wait_s
        state, _ = self.state()
        while state in ("COMPLETING", "RUNNING") and time.monotonic() < deadline:
            time.sleep(POLL_S)
            state, _ = self.state()
        return state + (" (ending: cancelled, failed, out of time or its node down)" if state == "COMPLETING" else "")

    def wait_running(self, timeout: float, report: Callable[[str], None] = lambda message: None) -> None:
        """Return once the job runs; raise TimeoutError if it pends ``timeout`` seconds (the
        caller cancels it), or RuntimeError if it ended first."""
        deadline = time.monotonic() + timeout
        said = None
        while True:
            state, reason = self.state()
            if state == "RUNNING":
                return
            if state in ENDED or state == "GONE":
                raise RuntimeError(
                    f"slurm job {self.job_id} ended {state} before its engines ran"
                    + (f" ({_explain(reason)})" if reason else "")
                    + "; its output is in the engine log of the profile"
                )
            if (state, reason) != said:
                report(f"slurm job {self.job_id} {state.lower()}: {_explain(reason)}")
                said = (state, reason)
            if time.monotonic() > deadline:  # the caller's stop cancels it
                raise TimeoutError(
                    f"slurm job {self.job_id} pending: {_explain(reason)} — still "
                    f"{state} after {timeout:g} s (pending_timeout), so it is "
                    "cancelled; ask for fewer nodes or CPUs, another partition, "
                    "or a longer pending_timeout"
                )
            time.sleep(POLL_S)

    def cancel(self, wait_s: float = CANCEL_WAIT_S) -> None:
        """``scancel`` the job and wait until it has left the queue (its processes ended)."""
        subprocess.run(["scancel", self.job_id], capture_output=True, timeout=30)
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            listed = _squeue("-j", self.job_id, "-o", "%T")
            if listed is not None and (not listed.stdout.strip() or "Invalid job id" in listed.stderr):
                return
            time.sleep(POLL_S)
        raise RuntimeError(
            f"slurm job {self.job_id} still listed {wait_s:g} s after scancel "
            f"({self.state()[0]}); check `squeue -j {self.job_id}`"
        )


def _explain(reason: str) -> str:
    meaning = REASONS.get(reason)
    return f"{reason} — {meaning}" if meaning else (reason or "no reason given")
