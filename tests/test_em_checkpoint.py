"""EM checkpoints: a fit or a panel killed mid-run continues from its file, step for step the
run that was not interrupted (EM is deterministic: equal bits, not a tolerance)."""

import json
import os
import pickle
import time

import numpy as np
import pytest
from kernels import kernel, new_tag, run

from mixle_nb.checkpoint import EMCheckpoint, write_atomically
from mixle_nb.inference import fit, optimize
from mixle_nb.stats import GaussianEstimator, MixtureEstimator


class Died(Exception):
    """Stands in for the process dying after an iteration."""


def data():
    rng = np.random.default_rng(3)
    return np.concatenate([rng.normal(-3, 1, 400), rng.normal(0, 0.5, 300), rng.normal(4, 1.5, 300)])


def estimator():
    return MixtureEstimator([GaussianEstimator()] * 3)


def numbers(model):
    return np.concatenate([model.w] + [[c.mu, c.sigma2] for c in model.components])


def die_at(start, iteration):
    def on_step(record):
        if (record.start, record.step) == (start, iteration):
            raise Died()

    return on_step


@pytest.mark.parametrize("every", [1, 3])
def test_a_fit_killed_mid_start_resumes_as_the_same_run(tmp_path, every):
    x, path = data(), tmp_path / "fit.ckpt"
    options = dict(init="random_from_data", n_init=3, max_its=25, delta=1e-12, rng=7, out=None)
    whole = fit(x, estimator(), **options)
    with pytest.raises(Died):  # dies in the second start, after iteration 8 was saved (or 6)
        fit(x, estimator(), checkpoint=EMCheckpoint(path, every=every), on_step=die_at(1, 9), **options)
    saved = pickle.loads(path.read_bytes())
    assert (saved["start"], len(saved["run"][2])) == (1, 8 - 8 % every)

    steps = []
    resumed = fit(x, estimator(), checkpoint=EMCheckpoint(path, every=every), on_step=steps.append, **options)
    assert (steps[0].start, steps[0].step) == (1, 8 - 8 % every + 1)  # nothing run twice
    np.testing.assert_array_equal(numbers(resumed.model), numbers(whole.model))
    assert resumed.restarts == whole.restarts
    assert [r.log_density for r in resumed.history] == [r.log_density for r in whole.history]
    assert (resumed.n_iter, resumed.converged) == (whole.n_iter, whole.converged)
    # a finished fit's file gives its result without another step
    ran = len(steps)
    again = fit(x, estimator(), checkpoint=path, on_step=steps.append, **options)
    assert len(steps) == ran and again.restarts == whole.restarts
    np.testing.assert_array_equal(numbers(again.model), numbers(whole.model))


def test_optimize_checkpoints_and_resumes_like_fit(tmp_path):
    """Issue 36, item 6: ``optimize`` passes ``checkpoint=`` to ``fit`` (before, it had no such
    argument): killed mid-run, it continues from its file to the model of the run that was not."""
    x, path = data(), tmp_path / "optimize.ckpt"
    options = dict(init="random_from_data", max_its=12, delta=1e-12, rng=3, out=None)
    whole = optimize(x, estimator(), **options)
    with pytest.raises(Died):
        optimize(x, estimator(), checkpoint=path, on_step=die_at(0, 5), **options)
    assert len(pickle.loads(path.read_bytes())["run"][2]) == 4
    steps = []
    resumed = optimize(x, estimator(), checkpoint=path, on_step=steps.append, **options)
    assert steps[0].step == 5
    np.testing.assert_array_equal(numbers(resumed), numbers(whole))
    with pytest.raises(TypeError, match="unexpected keyword argument 'checkpiont'"):
        optimize(x, estimator(), checkpiont=path, **options)  # a misspelt option is refused, not dropped


def test_a_checkpoint_of_another_fit_is_refused_before_any_step(tmp_path):
    x, path = data(), tmp_path / "fit.ckpt"
    fit(x, estimator(), init="random_from_data", n_init=1, max_its=3, rng=0, out=None, checkpoint=path)
    with pytest.raises(ValueError, match=r"n_init=1.*not n_init=2.*delete it"):
        fit(x, estimator(), init="random_from_data", n_init=2, max_its=3, rng=0, out=None, checkpoint=path)


def test_a_write_that_fails_part_way_leaves_the_old_file_whole_and_no_partial_file(tmp_path, monkeypatch):
    path = tmp_path / "state"
    write_atomically(path, b"old")

    def torn(fd):
        raise OSError("disk full")

    monkeypatch.setattr(os, "fsync", torn)
    with pytest.raises(OSError, match="disk full"):
        write_atomically(path, b"new" * 1000)
    assert path.read_bytes() == b"old"
    assert os.listdir(tmp_path) == ["state"]


PANEL = """
import json
from mixle_nb.checkpoint import EMCheckpoint
from mixle_nb.stats import seq_encode
from mixle_nb.widgets import EMPanel
from test_em_checkpoint import data, estimator
est = estimator()
panel = EMPanel(handle=seq_encode(data(), estimator=est), estimator=est, init="random_from_data", seed=5,
                checkpoint=EMCheckpoint({path!r}, every=4))
print(json.dumps(len(panel.history)))
"""


@pytest.mark.kernel
def test_a_kernel_killed_during_run_n_resumes_its_panel_from_the_checkpoint(tmp_path):
    """The panel runs locally in a real kernel, which is killed by force mid-run; the restarted
    kernel's panel, built with the same checkpoint, has the steps saved and runs on."""
    path, total = str(tmp_path / "panel.ckpt"), 300
    with kernel(new_tag()) as (manager, client):
        assert json.loads(run(client, PANEL.format(path=path))) == 0
        client.execute("panel.run(100000, block=False)")
        deadline = time.monotonic() + 60
        while not os.path.exists(path) or len(load(path)["history"]) < 40:
            assert time.monotonic() < deadline, "the panel saved no 40 steps in 60 s"
            time.sleep(0.01)
        manager.restart_kernel(now=True)
        client.wait_for_ready(timeout=60)
        kept = json.loads(run(client, PANEL.format(path=path)))
        assert 40 <= kept < 100000 and kept % 4 == 0
        run(client, f"panel.run({total} - len(panel.history))")
        resumed = load(path)
    from mixle_nb.stats import seq_encode
    from mixle_nb.widgets import EMPanel

    est = estimator()
    reference = EMPanel(handle=seq_encode(data(), estimator=est), estimator=est, init="random_from_data", seed=5)
    reference.run(total)
    assert len(resumed["history"]) == total
    assert [r.log_density for r in resumed["history"]] == [r.log_density for r in reference.history]
    np.testing.assert_array_equal(numbers(resumed["history"][-1].model), numbers(reference.model))
    np.testing.assert_array_equal(numbers(resumed["start_model"]), numbers(reference.start_model))


def load(path):
    with open(path, "rb") as f:
        return pickle.load(f)
