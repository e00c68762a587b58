"""benchmarks/peer_grid.py, the instrument of the peer grid: its trim rules, ratios, merging and
call cap on hand-made inputs, and a tiny slice run for real (ours against scikit-learn, 2 cells,
seconds) whose JSON, ratios and heat maps are checked. Speed itself is measured there, not here."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import grid_trims  # noqa: E402
import peer_grid  # noqa: E402
import peer_grid_report  # noqa: E402


def result(low_s: float, iteration_s: float, fit_s: float) -> dict[str, float]:
    return {"low_s": low_s, "iteration_s": iteration_s, "fit_s": fit_s, "steps": 2}


def test_affine_prediction_and_the_trim_kinds():
    assert grid_trims.affine([(100, 1.0), (1000, 1.9)], 10_000) == pytest.approx(1.9 + 0.001 * 9000)
    assert grid_trims.affine([(100, 2.0), (1000, 1.0)], 10_000) == 2.0 - 1.0  # a falling line is held flat at its last
    trims = grid_trims.Trims(max_call_s=3.0, max_gb=1.0)
    assert trims.reason("pomegranate", "fit", 100, 2, 2, "tied", 1)["kind"] == "unsupported"
    memory = trims.reason("scikit-learn", "fit", 10**7, 8, 8, "full", 1)  # 1e7·8·8·9 bytes = 5.8 GB
    assert memory["kind"] == "memory" and "6 GB" in memory["reason"]
    # fit: 0.1 s at 1e3, 0.3 s at 1e4 -> 0.1 + 0.2/9000·(1e5 - 1e3) = 2.3 s at 1e5 (under 2 caps), 22.3 s at 1e6
    for n, fit_s in ((1000, 0.1), (10_000, 0.3)):
        trims.record("scikit-learn", n, 2, 2, "full", 1, result(0.01, 0.001, fit_s))
    assert trims.reason("scikit-learn", "fit", 100_000, 2, 2, "full", 1) is None
    assert trims.predicted_call_s("scikit-learn", "fit", 100_000, 2, 2, "full", 1) == pytest.approx(
        0.1 + 0.2 * 99_000 / 9000
    )
    predicted = trims.reason("scikit-learn", "fit", 10**6, 2, 2, "full", 1)
    assert predicted["kind"] == "predicted" and "22.3 s" in predicted["reason"]
    trims.record("scikit-learn", 10**6, 2, 2, "full", 1, {"fit_trimmed": predicted})
    assert trims.reason("scikit-learn", "fit", 10**6, 8, 2, "full", 1) is None  # a prediction blocks no other column
    # the iteration's longest call: low + PILOT_STEPS iterations, each affine
    expected = 0.01 + 2 * 0.001 * 1.0  # flat lines: low 0.01 s, an iteration 1 ms
    assert trims.predicted_call_s("scikit-learn", "iteration", 10**6, 2, 2, "full", 1) == pytest.approx(expected)
    # over the cap at N=1e4, D=8, K=8: trimmed there and above in N, D and K, not below or beside
    trims.record("torchgmm", 10_000, 8, 8, "diag", 2, {"fit_trimmed": grid_trims.trim("cap", "stopped")})
    assert trims.reason("torchgmm", "fit", 100_000, 32, 8, "diag", 2)["kind"] == "dominated"
    assert trims.reason("torchgmm", "fit", 10_000, 8, 8, "diag", 2)["kind"] == "dominated"
    for below in (
        (1000, 8, 8, "diag", 2),
        (100_000, 2, 8, "diag", 2),
        (100_000, 32, 8, "full", 2),
        (100_000, 8, 8, "diag", 1),
    ):
        assert trims.reason("torchgmm", "fit", *below) is None, below
    assert trims.reason("torchgmm", "iteration", 100_000, 8, 8, "diag", 2) is None


def test_outpaced_needs_a_bound_over_ten_times_another_peers():
    trims = grid_trims.Trims(max_call_s=100.0, max_gb=100.0)
    for n, slow, fast in ((100, 0.5, 0.002), (1000, 0.6, 0.02)):
        trims.record("torchgmm", n, 2, 2, "full", 1, result(0.1, 0.01, slow))
        trims.record("scikit-learn", n, 2, 2, "full", 1, result(0.001, 0.0001, fast))
    # at 1e4: torchgmm's fit 0.6 + 0.1/900·9000 = 1.6 s; scikit-learn's 0.02 + 0.018/900·9000 = 0.2 s: 8x, kept
    assert trims.outpaced("torchgmm", ["scikit-learn"], "fit", 10_000, 2, 2, "full", 1) is None
    # at 1e3 (the last measured N is the bound): 0.6 s against 0.02 s, 30x: trimmed, never the other way
    out = trims.outpaced("torchgmm", ["scikit-learn"], "fit", 1000, 2, 2, "full", 1)
    assert out["kind"] == "outpaced" and "scikit-learn" in out["reason"]
    assert trims.outpaced("scikit-learn", ["torchgmm"], "fit", 1000, 2, 2, "full", 1) is None
    # 2 threads, no 2-thread history: this cell at 1 thread, the slow one halved, the fast one whole
    assert trims.outpaced("torchgmm", ["scikit-learn"], "fit", 1000, 2, 2, "full", 2) is not None  # 0.3 > 10·0.02
    assert trims.outpaced("torchgmm", ["scikit-learn"], "fit", 100, 2, 2, "full", 2) is not None  # 0.25 > 10·0.002
    assert trims.outpaced("torchgmm", ["pomegranate"], "fit", 1000, 2, 2, "full", 1) is None  # nothing known of it


def test_ratios_are_ours_over_the_fastest_positive_peer():
    cell = {
        "results": {
            "mixle_nb": {"iteration_s": 0.002, "fit_s": 0.5},
            "scikit-learn": {"iteration_s": 0.004, "fit_s": 0.25},
            "pomegranate": {"iteration_s": -0.001, "fit_trimmed": grid_trims.trim("cap", "stopped")},
            "torchgmm": {"iteration_s": 0.003, "fit_s": 0.4},
        }
    }
    out = peer_grid.with_ratios(cell)
    assert out["iteration_ratio"] == pytest.approx(0.002 / 0.003) and out["fastest_peer"]["iteration"] == "torchgmm"
    assert out["fit_ratio"] == pytest.approx(2.0) and out["fastest_peer"]["fit"] == "scikit-learn"
    alone = peer_grid.with_ratios({"results": {"mixle_nb": {"fit_s": 1.0}, "scikit-learn": {"fit_failed": "x"}}})
    assert alone["fit_ratio"] is None and alone["iteration_ratio"] is None
    grid = {"cells": [{**out, "n": 100, "d": 2, "k": 2, "covariance_type": "full", "threads": 1}]}
    assert peer_grid_report.ahead_rows(grid) == [[1, "full", 2, 2, 100, "fit", 2.0, "scikit-learn", 0.5, 0.25]]
    assert peer_grid_report.trim_rows(grid)[0][:4] == ["pomegranate", "cap", 0, 1]
    cap, tied = grid_trims.trim("cap", "stopped"), grid_trims.trim("unsupported", "no tied")
    peers_out = {"mixle_nb": {"fit_trimmed": grid_trims.trim("no peer", "")}, "pomegranate": {"fit_trimmed": tied}}
    peers_out["scikit-learn"] = {"fit_trimmed": cap}
    assert peer_grid_report.trim_kind({"results": peers_out}, "fit") == "cap"  # the heat map's label
    assert peer_grid_report.trim_kind(cell, "fit") is None


def test_steps_last_the_set_up_or_a_tenth_of_a_second_and_never_hundreds_of_slow_calls():
    assert peer_grid.steps_for(low_s=0.001, per_iteration_s=0.001, most_s=0.002) == 100  # 0.1 s / 1 ms
    assert peer_grid.steps_for(low_s=0.5, per_iteration_s=0.01, most_s=0.05) == 50  # the set-up's 0.5 s
    assert peer_grid.steps_for(low_s=0.05, per_iteration_s=-0.01, most_s=0.04) == 20  # noise: an eighth of 40 ms
    assert peer_grid.steps_for(low_s=5.0, per_iteration_s=1.0, most_s=2.0) == 5
    assert peer_grid.steps_for(low_s=0.0001, per_iteration_s=1e-9, most_s=1e-9) == peer_grid.MAX_STEPS


def test_a_rounds_whole_fit_is_the_mean_over_the_same_seeds_for_every_library():
    assert peer_grid.fit_seeds(100) == peer_grid.fit_seeds(1_000) == tuple(range(20))
    assert peer_grid.fit_seeds(10_000) == tuple(range(5)) and peer_grid.fit_seeds(100_000) == (0,)
    seen = []

    def whole(seed: int) -> int:
        seen.append(seed)
        time.sleep(0.01 * seed)
        return 2 * seed

    contender = peer_grid.Contender(lambda m: None, whole, {"fit"}, None, fit_seeds=(0, 1, 2))
    contender.round(0, 0.0)
    result = contender.result()
    assert seen == [0, 1, 2] and result["fit_seeds"] == 3 and result["fit_n_iter"] == 2
    assert 0.01 <= result["fit_s"] < 0.02  # (0 + 0.01 + 0.02 s) / 3, not the least or the sum

    def fails_at_one(seed: int) -> int:
        if seed == 1:
            raise IndexError("an empty cluster")
        return 2

    failing = peer_grid.Contender(lambda m: None, fails_at_one, {"fit"}, None, fit_seeds=(0, 1, 2))
    failing.round(0, 0.0)
    assert failing.result()["fit_failed"] == "random_state=1: IndexError: an empty cluster"
    assert "fit_s" not in failing.result()  # no mean over the seeds that ran


def test_a_call_over_the_cap_is_stopped_even_where_a_library_wraps_the_error():
    def spin() -> None:
        end = time.monotonic() + 5
        while time.monotonic() < end:
            pass

    def wrapped() -> None:
        try:
            spin()
        except Exception as error:
            raise RuntimeError("EM iteration failed") from error

    for fn in (spin, wrapped):
        t0 = time.monotonic()
        with pytest.raises(Exception) as caught:
            peer_grid.timed(fn, 0.0, 0.2)
        assert peer_grid.over_cap(caught.value) and time.monotonic() - t0 < 2
    assert not peer_grid.over_cap(RuntimeError("no"))
    assert peer_grid.timed(lambda: 7, 0.0, 1.0)[1] == 7


def test_merge_keeps_every_run_and_the_later_cell():
    def grid(git: str, ratio: float, n: int) -> dict:
        cell = {"n": n, "d": 2, "k": 2, "covariance_type": "full", "threads": 1, "run": 0, "iteration_ratio": ratio}
        return {
            "schema": 2,
            "runs": [{"git": git}],
            "cells": [cell],
            "grid_search": [{"run": 0, "threads": 1, "seconds": {}}],
        }

    into = grid("a", 1.0, 100)
    peer_grid.merge(into, grid("b", 2.0, 100))
    peer_grid.merge(into, grid("c", 3.0, 1000))
    assert [r["git"] for r in into["runs"]] == ["a", "b", "c"]
    assert [(c["n"], c["iteration_ratio"], c["run"]) for c in into["cells"]] == [(100, 2.0, 1), (1000, 3.0, 2)]
    assert into["grid_search"] == [{"run": 2, "threads": 1, "seconds": {}}]


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    """A real slice: N = 100, D = 2, K = 2, tied, 1 and 2 threads, ours and scikit-learn's."""
    out = tmp_path_factory.mktemp("grid") / "grid.json"
    command = [sys.executable, "benchmarks/peer_grid.py", "--n", "1e2", "--d", "2", "--k", "2", "--cov", "tied"]
    command += ["--threads", "1,2", "--libraries", "mixle_nb,scikit-learn", "--cell-s", "0.05", "--repeats", "2"]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([*command, "--out", str(out)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out, json.loads(out.read_text()), proc.stdout


@pytest.mark.subprocess
def test_a_slice_writes_its_cells_ratios_provenance_and_heat_maps(smoke):
    out, data, stdout = smoke
    assert data["schema"] == 2 and len(data["runs"]) == 1
    run = data["runs"][0]
    assert {"date", "end", "elapsed_s", "command", "load", "load_end", "git", "versions", "options"} <= set(run)
    assert "--libraries mixle_nb,scikit-learn" in run["command"] and run["options"]["max_call_s"] == 3.0
    keys = sorted(peer_grid.cell_key(c) for c in data["cells"])
    assert keys == [(100, 2, 2, "tied", 1), (100, 2, 2, "tied", 2)]
    for cell in data["cells"]:
        ours, theirs = cell["results"]["mixle_nb"], cell["results"]["scikit-learn"]
        for entry in (ours, theirs):
            assert entry["fit_s"] > 0 and entry["fit_n_iter"] >= 1 and 2 <= entry["steps"] <= peer_grid.MAX_STEPS
            assert entry["fit_seeds"] == len(peer_grid.fit_seeds(100)) > 1
            assert 1 <= entry["rounds"] <= 2 and entry["low_s"] > 0
        if theirs["iteration_s"] > 0 and ours["iteration_s"] > 0:
            assert cell["iteration_ratio"] == pytest.approx(ours["iteration_s"] / theirs["iteration_s"])
        assert cell["fit_ratio"] == pytest.approx(ours["fit_s"] / theirs["fit_s"])
        assert cell["run"] == 0 and cell["load"] >= 0 and cell["elapsed_s"] > 0
    for threads in (1, 2):
        assert peer_grid_report.heat_map_path(out.with_suffix(""), threads).read_bytes()[:4] == b"\x89PNG"
    assert "2 cells" in stdout


@pytest.mark.subprocess
def test_resume_keeps_the_cells_of_this_commit(smoke, capsys):
    out, data, _ = smoke
    args = peer_grid.parse(["--n", "1e2", "--d", "2", "--k", "2", "--cov", "tied", "--resume", "--out", str(out)])
    again = {**data, "runs": [*data["runs"], dict(data["runs"][0])]}
    before = json.dumps(again["cells"], sort_keys=True)
    peer_grid.Grid(args, again, None, time.monotonic()).run_all()  # every cell kept: nothing measured
    assert json.dumps(again["cells"], sort_keys=True) == before
    with pytest.raises(SystemExit):
        peer_grid.parse(["--cov", "banana"])
    assert "--cov: unknown ['banana']; the covariance types are full, tied, diag, spherical" in capsys.readouterr().err
