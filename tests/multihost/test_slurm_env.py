"""What a Slurm task derives from its environment (no Slurm needed): store address, rank and
world under ``srun``, and the CUDA device under ``--gpus-per-task`` — CUDA cannot run here, so
the device choice is tested with the variables Slurm sets (mocked, not a GPU). Also the batch
template and option checks of ``MixleCluster(launcher="slurm")``."""

import pytest

from mixle_nb.cluster import MixleCluster
from mixle_nb.cluster.slurm import SlurmSpec
from mixle_nb.parallel.slurm_env import first_host, launcher_variables, task_device

STEP = {
    "SLURM_PROCID": "5",
    "SLURM_NTASKS": "8",
    "SLURM_LOCALID": "1",
    "SLURM_JOB_ID": "4242",
    "SLURM_JOB_NODELIST": "gpu[007-009,012],cpu1",
}


@pytest.mark.parametrize(
    "nodelist, first",
    [
        ("node17", "node17"),
        ("a,b", "a"),
        ("gpu[007-009,012],cpu1", "gpu007"),
        ("n[3,5]", "n3"),
        ("rack1-n[10-11]", "rack1-n10"),
    ],
)
def test_first_host_of_a_slurm_hostlist(nodelist, first):
    assert first_host(nodelist) == first


def test_an_srun_task_gets_torch_launcher_variables():
    assert launcher_variables(STEP) == {
        "RANK": "5",
        "WORLD_SIZE": "8",
        "LOCAL_RANK": "1",
        "MASTER_ADDR": "gpu007",
        "MASTER_PORT": str(15000 + 4242),
    }
    # the step's own node list before the job's; variables already set win (torchrun in a job)
    step = {**STEP, "SLURM_STEP_NODELIST": "gpu[009]", "MASTER_PORT": "29500"}
    assert launcher_variables(step)["MASTER_ADDR"] == "gpu009"
    assert launcher_variables(step)["MASTER_PORT"] == "29500"
    assert launcher_variables({"SLURM_JOB_ID": "1"}) == {}  # not in a step: nothing derived


@pytest.mark.parametrize(
    "env, count, device",
    [
        ({"SLURM_LOCALID": "3", "CUDA_VISIBLE_DEVICES": "2"}, None, 0),  # --gpus-per-task=1
        ({"SLURM_LOCALID": "3", "CUDA_VISIBLE_DEVICES": "0,1,2,3"}, None, 3),  # tasks share a node's GPUs
        ({"SLURM_LOCALID": "1"}, 4, 1),  # no binding: torch's count
    ],
)
def test_each_task_chooses_its_own_gpu(env, count, device):
    assert task_device(env, device_count=count) == device


def test_a_task_without_a_gpu_of_its_own_is_a_clear_error():
    with pytest.raises(ValueError, match=r"task 6 \(local rank 2\) sees 2 GPUs.*--gpus-per-task=1"):
        task_device({"SLURM_PROCID": "6", "SLURM_LOCALID": "2", "CUDA_VISIBLE_DEVICES": "0,1"})


def test_the_batch_template_carries_the_sbatch_options():
    spec = SlurmSpec.from_options(
        "slurm",
        {
            "partition": "p",
            "account": "a",
            "time": "00:30:00",
            "nodes": 2,
            "ntasks_per_node": 4,
            "gpus_per_task": 1,
            "extra_sbatch": ["--qos=debug", "--comment={x}"],
        },
    )
    template = spec.batch_template(8)
    for line in (
        "--ntasks=8",
        "--partition=p",
        "--account=a",
        "--time=00:30:00",
        "--nodes=2",
        "--ntasks-per-node=4",
        "--gpus-per-task=1",
        "--qos=debug",
        "--comment={{x}}",
    ):
        assert f"#SBATCH {line}\n" in template
    assert template.rstrip().endswith('--IPEngine.id="$SLURM_PROCID"\' {program_and_args}')


@pytest.mark.parametrize(
    "options, message",
    [
        ({"partition": "p"}, r"partition= need launcher='slurm'"),
        ({"launcher": "slurm", "nodes": 0}, r"nodes"),
        ({"launcher": "slurm", "time": ""}, r"time must be a non-empty string"),
        ({"launcher": "slurm", "extra_sbatch": "--qos=debug"}, r"extra_sbatch must be a list"),
        ({"launcher": "slurm", "pending_timeout": -1}, r"pending_timeout"),
    ],
)
def test_bad_slurm_options_are_refused_before_anything_starts(options, message):
    with pytest.raises(ValueError, match=message):
        MixleCluster(2, **options)


def test_the_magic_passes_its_slurm_options_to_the_cluster():
    """%mixle_cluster's sbatch flags reach MixleCluster: given to the local launcher they are
    refused there, by name, before anything starts."""
    from IPython.core.error import UsageError
    from IPython.testing.globalipapp import start_ipython

    shell = start_ipython()
    shell.run_line_magic("load_ext", "mixle_nb")
    with pytest.raises(UsageError, match=r"partition=, time=, extra_sbatch= need launcher='slurm'"):
        shell.run_line_magic("mixle_cluster", "start 2 --partition p --time 00:30:00 --extra-sbatch=--qos=debug")


def test_slurm_options_are_read_not_taken_and_an_unknown_one_is_a_type_error():
    options = {"partition": "p", "nodes": 2}
    spec = SlurmSpec.from_options("slurm", options)
    assert options == {"partition": "p", "nodes": 2}  # the caller's dict is left as it was
    assert (spec.partition, spec.nodes) == ("p", 2)
    with pytest.raises(TypeError, match=r"unknown Slurm options \['partiton'\]"):
        SlurmSpec.from_options("slurm", {"partiton": "p"})
