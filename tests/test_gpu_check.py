"""benchmarks/gpu_check.sh --cpu-smoke: every step of the prepared GPU check, tiny and on the
CPU (gloo), so that the script a GPU machine runs once cannot rot between those runs."""

import os
import re
import subprocess
import sys

import pytest

# ranks: its steps start gloo ranks; subprocess: it is a shell script of other Python programs,
# which puts it in `make test`'s side lane (it mostly waits on them)
pytestmark = [pytest.mark.ranks, pytest.mark.subprocess]

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NUMBER = r"([0-9.]+(?:e[+-]?\d+)?)"


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    """The smoke run's exit status, stdout and the report it wrote to $OUT."""
    out = tmp_path_factory.mktemp("gpu_check")
    env = {**os.environ, "OUT": str(out), "PYTHON": sys.executable, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        ["bash", "benchmarks/gpu_check.sh", "--cpu-smoke"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=600,
    )
    report = (out / "gpu_check.txt").read_text()
    return proc.returncode, proc.stdout, report


def test_smoke_runs_every_step_and_writes_the_report(smoke):
    rc, stdout, report = smoke
    assert rc == 0, stdout
    assert report == stdout
    for step in ("env", "agree", "em-speed", "lm", "fixed-cost", "float32"):
        assert re.search(rf"^== {step} took \d+ s$", report, re.M), step
    assert not re.search(r"^FAIL", report, re.M), report
    assert re.search(r"^== summary: 8 PASS, 0 MISS, 0 FAIL, \d+ SKIP; 0 step\(s\) failed", report, re.M), report


def test_agreement_lines_pass_with_their_numbers(smoke):
    report = smoke[2]
    lines = re.findall(
        rf"^PASS  agreement (.+): log-density rel diff {NUMBER}, parameters rel diff {NUMBER} "
        r"\(limit 1e-10\)$",
        report,
        re.M,
    )
    names = [name for name, _, _ in lines]
    assert any(n.startswith("1-D Gaussian mixture") and "fit on cpu vs cpu" in n for n in names), report
    assert any(n.startswith("diagonal") for n in names) and any(n.startswith("full covariance") for n in names)
    assert any("TorchRunEncodedData world 1 (gloo)" in n for n in names), report
    for _, log_density, parameters in lines:
        assert float(log_density) <= 1e-10 and float(parameters) <= 1e-10


def test_speed_lines_name_every_contender_with_a_rate(smoke):
    report = smoke[2]
    for workload in ("N=2e+04 D=1 K=8", "N=4e+03 D=8 K=8"):
        block = report.split(f"{workload}:\n", 1)[1]
        for contender in ("ours on cpu", "hand-written torch on cpu", "ours on this machine's CPU", "scikit-learn"):
            rate = re.search(rf"^      {re.escape(contender)}\s+{NUMBER} it/s\s+{NUMBER} ms$", block, re.M)
            assert rate and float(rate.group(1)) > 0, (contender, block)
        assert re.search(rf"^SKIP  ours/hand-written time {re.escape(workload)}: {NUMBER} \(limit 1.5\)", block, re.M)
    assert re.search(r"^SKIP  ours on cpu over the dev machine's CPU EM at N=1e7 D=1 K=8 \(\d+ ms, ", report, re.M)


def test_float32_lines_time_both_dtypes_and_pass_agreement(smoke):
    report = smoke[2]
    for workload in ("1-D N=2e+04 D=1 K=8", "diag N=4e+03 D=8 K=8", "full N=4e+03 D=8 K=8"):
        times = re.search(
            rf"^      {re.escape(workload)}: float64 {NUMBER} ms, float32 {NUMBER} ms, float32/float64 {NUMBER}$",
            report,
            re.M,
        )
        assert times and float(times.group(1)) > 0 and float(times.group(2)) > 0, (workload, report)
        agreement = re.search(
            rf"^PASS  float32 agreement {re.escape(workload)} on cpu: means differ by {NUMBER} .*\(limit 1e-05\)$",
            report,
            re.M,
        )
        assert agreement and float(agreement.group(1)) <= 1e-5, (workload, report)


def test_language_model_trains_sharded_and_the_fixed_cost_is_read(smoke):
    report = smoke[2]
    lm = re.search(
        rf"^PASS  LM world 1, FSDP2, bf16, activation checkpointing on gloo: 20 steps, "
        rf"loss {NUMBER} \(first 5\) -> {NUMBER} \(last 5\), all finite: True; .*"
        r"fully_shard applied: True",
        report,
        re.M,
    )
    assert lm and float(lm.group(2)) < float(lm.group(1)), report
    assert re.search(r"^SKIP  LM 2 ranks, nccl DDP: this machine has 0 CUDA device\(s\); it needs 2$", report, re.M)
    cost = re.search(rf"^SKIP  fixed cost per EM step, 2 ranks, N=1000, gloo on \d+ cores: {NUMBER} ms", report, re.M)
    assert cost and float(cost.group(1)) > 0, report
