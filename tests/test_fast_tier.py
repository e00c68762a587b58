"""The fast tier's guard (tests/fast_tier.py): under a ``-m`` that deselects the process markers,
starting a cluster, ranks, a kernel or a Python process raises and names the marker to add;
helper tools still run. Starts nothing itself: every start here is refused."""

import pathlib
import re
import subprocess
import sys

import pytest
from fast_tier import PROCESS_MARKERS, Guard, deselected_markers, starter_kind, starts_nothing

from mixle_nb.parallel.local_launch import run_local

FAST = "not (" + " or ".join(PROCESS_MARKERS) + ")"


class _Config:
    def __init__(self, markexpr: str):
        self.markexpr = markexpr

    def getoption(self, name: str, default: str = "") -> str:
        return self.markexpr if name == "markexpr" else default


def _rank(rank: int, world: int) -> int:
    return rank


@pytest.fixture
def guard():
    guard = Guard(PROCESS_MARKERS)
    guard.test = "tests/example.py::test_x"
    guard.install()
    yield guard
    guard.uninstall()


def test_the_fast_tier_expression_guards_every_process_marker_and_a_full_run_none():
    assert deselected_markers(_Config(FAST)) == PROCESS_MARKERS
    assert deselected_markers(_Config("not cluster")) == ("cluster",)
    assert deselected_markers(_Config("")) == ()


def test_only_a_run_that_selects_no_process_marker_is_guarded():
    assert starts_nothing(_Config(FAST))
    root = pathlib.Path(__file__).resolve().parent.parent
    side = re.search(r"^SIDE := (.+)$", (root / "Makefile").read_text(), re.M)
    assert side is not None, "the Makefile's SIDE expression (make test's second lane) is gone"
    for lane in (side.group(1), f"not ({side.group(1)})", ""):
        assert not starts_nothing(_Config(lane)), lane


def test_python_and_launchers_are_starters_and_helper_tools_are_not():
    assert starter_kind([sys.executable, "-c", "pass"]) is not None
    assert starter_kind(["torchrun", "--nproc_per_node", "2", "fit.py"]) == "ranks"
    assert starter_kind(["/usr/bin/chromium", "--headless"]) == "browser"
    assert starter_kind(["git", "status"]) is None
    assert starter_kind("ldconfig -p") is None


def test_a_cluster_started_without_its_marker_fails_naming_it(guard):
    from mixle_nb.cluster import MixleCluster

    with pytest.raises(RuntimeError, match=r"tests/example.py::test_x started a MixleCluster.*@pytest.mark.cluster"):
        MixleCluster(2).start()


def test_ranks_started_without_their_marker_fail_naming_it(guard):
    with pytest.raises(RuntimeError, match=r"@pytest.mark.ranks"):
        run_local(_rank, 2, timeout=10)


def test_a_python_process_or_kernel_without_a_marker_fails(guard):
    with pytest.raises(RuntimeError, match=r"started the process .*mark the test"):
        subprocess.run([sys.executable, "-c", "pass"], check=True)
    pytest.importorskip("jupyter_client")
    from jupyter_client.manager import KernelManager

    manager = KernelManager(kernel_name="python3")
    try:
        with pytest.raises(RuntimeError, match=r"@pytest.mark.kernel"):
            manager.start_kernel()
    finally:
        manager.cleanup_resources()


def test_helper_tools_still_run(guard):
    assert subprocess.run(["true"]).returncode == 0


def test_uninstall_puts_back_what_was_there():
    before = subprocess.Popen.__init__
    guard = Guard(PROCESS_MARKERS)
    guard.install()
    assert subprocess.Popen.__init__ is not before
    guard.uninstall()
    assert subprocess.Popen.__init__ is before


def test_make_check_deselects_exactly_the_guarded_markers_and_pyproject_registers_them():
    root = pathlib.Path(__file__).resolve().parent.parent
    fast = re.search(r"^FAST := (.+)$", (root / "Makefile").read_text(), re.M)
    assert fast is not None, "the Makefile's FAST expression (make check's -m) is gone"
    assert deselected_markers(_Config(fast.group(1).strip())) == PROCESS_MARKERS
    markers = re.search(r"^markers = \[(.*?)^\]", (root / "pyproject.toml").read_text(), re.M | re.S)
    assert markers is not None, "pyproject.toml registers no pytest markers"
    assert set(PROCESS_MARKERS) <= set(re.findall(r'^\s*"(\w+):', markers.group(1), re.M))
