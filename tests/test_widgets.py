"""EMPanel and TrainPanel on a real 2-engine cluster, and a panel notebook run by nbclient.
Every wait has a deadline; the tests that kill an engine restart the cluster and rebuild its
handles before they end."""

from __future__ import annotations

import json
import time

import nbformat
import numpy as np
import pytest
from interrupts import interrupt_after, kernel_interrupts
from nbclient import NotebookClient
from strictness import import_or_unavailable

from mixle_nb.inference import optimize
from mixle_nb.stats import GaussianDistribution, MixtureDistribution, seq_encode
from mixle_nb.widgets import EMPanel, TrainPanel


def em_problem(n=20_000):
    rng = np.random.default_rng(0)
    x = np.concatenate([rng.normal(-2, 1, n // 2), rng.normal(3, 0.7, n - n // 2)])
    start = MixtureDistribution(
        [GaussianDistribution(-1, 1), GaussianDistribution(0.5, 1), GaussianDistribution(2, 1)], [0.3, 0.3, 0.4]
    )
    return x, start


def _make_em_handle():
    """On a rank: shard the pushed data into a resident handle named `h`."""
    from mixle_nb.cluster.rank_side import rank_namespace
    from mixle_nb.parallel import TorchRunEncodedData

    ns = rank_namespace()
    ns["h"] = TorchRunEncodedData(ns["x"], estimator=ns["est"])
    return ns["h"].local_count


@pytest.fixture(scope="module")
def em_cluster(cluster2):
    x, start = em_problem()
    cluster2.push(x=x, est=start.estimator(), start=start)
    assert sum(cluster2.run(_make_em_handle)) == len(x)
    return cluster2


def wait_until(condition, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"{what} did not happen within {timeout_s} s"
        time.sleep(0.02)


def fresh_panel(cluster, **options) -> EMPanel:
    """A panel on the shared handle, started from the start model (earlier panels advanced it)."""
    cluster.push(start=em_problem()[1])
    return EMPanel(cluster, handle="h", estimator="est", model="start", **options)


def reference_log_densities(steps: int) -> list:
    x, start = em_problem()
    records = []
    optimize(x, start.estimator(), prev_estimate=start, max_its=steps, delta=0.0, out=None, on_step=records.append)
    return [r.log_density for r in records]


@pytest.mark.cluster
def test_em_panel_on_a_cluster_draws_rank_0s_data(em_cluster):
    """The model picture's histogram: evenly spaced observations of rank 0's shard (the
    Gaussians' point encoding keeps them; an older encoding's ``x`` was looked for and missed)."""
    from mixle_nb.widgets.em_panel import DATA_SAMPLE_SIZE

    shard = em_problem()[0][0::2]
    sample = fresh_panel(em_cluster).data_sample
    assert sample is not None and sample.shape == (min(DATA_SAMPLE_SIZE, len(shard)),)
    assert np.isin(sample, shard).all() and (sample[0], sample[-1]) == (shard[0], shard[-1])


@pytest.mark.cluster
def test_em_panel_matches_single_process_and_never_decreases(em_cluster):
    panel = fresh_panel(em_cluster)
    panel.step()
    panel.run(5)
    assert [r.step for r in panel.history] == list(range(1, 7))
    np.testing.assert_allclose([r.log_density for r in panel.history], reference_log_densities(6), rtol=1e-10)
    assert np.all(np.diff([r.log_density for r in panel.history]) >= 0)
    assert all(len(r.rank_seconds) == 2 for r in panel.history)
    assert panel.image.value[:4] == b"\x89PNG"


@pytest.mark.cluster
def test_back_then_step_reproduces_the_same_next_model(em_cluster):
    panel = fresh_panel(em_cluster)
    panel.run(4)
    fourth = panel.history[-1]
    panel.back(2)
    assert len(panel.history) == 2 and panel.model is panel.history[-1].model
    panel.run(2)
    assert repr(panel.history[-1].model) == repr(fourth.model)
    assert panel.history[-1].log_density == fourth.log_density
    panel.reset()
    assert panel.history == [] and repr(em_cluster.pull("start")) == repr(panel.start_model)


@pytest.mark.cluster
def test_pause_stops_a_run_within_one_step(em_cluster):
    panel = fresh_panel(em_cluster, batch_seconds=0)  # one step a call
    panel.run(10_000, block=False)
    wait_until(lambda: len(panel.history) >= 2, 60, "two steps of the run")
    seen = len(panel.history)
    panel.pause()
    panel.wait(30)
    assert not panel.running
    assert len(panel.history) <= seen + 1


@pytest.mark.cluster
def test_a_run_sends_batches_of_steps_sized_to_the_call_time(em_cluster):
    panel = fresh_panel(em_cluster, batch_seconds=0.15)
    panel.run(60)
    assert panel.error is None and [r.step for r in panel.history] == list(range(1, 61))
    np.testing.assert_allclose([r.log_density for r in panel.history], reference_log_densities(60), rtol=1e-10)
    assert panel.history[0].count == 20_000 and all(len(r.rank_seconds) == 2 for r in panel.history)
    # a step on 10,000 observations a rank takes milliseconds: far fewer calls than steps
    assert panel.step_calls < 20, panel.step_calls
    assert repr(em_cluster.pull("start")) == repr(panel.model)  # the ranks hold the last step's model
    one_a_call = fresh_panel(em_cluster, batch_seconds=0)
    one_a_call.run(5)
    assert one_a_call.step_calls == 5


@pytest.mark.cluster
def test_pause_stops_a_batched_run_after_the_calls_already_sent(em_cluster):
    panel = fresh_panel(em_cluster, batch_seconds=0.15)
    panel.run(100_000, block=False)
    wait_until(lambda: panel.step_calls >= 3, 60, "three calls of the run")
    panel.pause()
    calls = panel.step_calls
    panel.wait(30)
    assert not panel.running and panel.error is None
    assert panel.step_calls <= calls + 1  # the calls sent when paused finish, no other starts
    np.testing.assert_allclose(
        [r.log_density for r in panel.history[:100]], reference_log_densities(min(100, len(panel.history))), rtol=1e-10
    )


class _FailingHandle:
    """The handle ``h`` until its ``fail_at``-th EM step, which raises on every rank before any
    collective (so the ranks stay in step and alive)."""

    def __init__(self, inner, fail_at: int):
        self.inner, self.fail_at, self.steps = inner, fail_at, 0

    def pysp_em_step(self, estimator, model):
        self.steps += 1
        if self.steps == self.fail_at:
            raise ValueError(f"injected failure in step {self.steps}")
        return self.inner.pysp_em_step(estimator, model)


def _wrap_handle_failing_at(fail_at: int) -> None:
    from mixle_nb.cluster.rank_side import rank_namespace

    ns = rank_namespace()
    ns["h_failing"] = _FailingHandle(ns["h"], fail_at)


def _failing_handle_steps() -> int:
    from mixle_nb.cluster.rank_side import rank_namespace

    return rank_namespace()["h_failing"].steps


def failing_panel(cluster, fail_at: int) -> EMPanel:
    """A panel on a handle failing in its ``fail_at``-th step that has run 2 steps in two calls
    of one step: its next run sends 4 steps, then 16 queued behind them (``batch_seconds`` is
    large, so the growth limit, 4x the last call, sizes the calls)."""
    cluster.push(start=em_problem()[1])
    cluster.run(_wrap_handle_failing_at, fail_at)
    panel = EMPanel(cluster, handle="h_failing", estimator="est", model="start", batch_seconds=10.0)
    panel.run(2)
    assert panel.step_calls == 2 and panel.error is None
    return panel


@pytest.mark.cluster
def test_a_call_failing_mid_batch_keeps_the_steps_it_completed(em_cluster):
    panel = failing_panel(em_cluster, fail_at=9)
    panel.run(20)  # a call of steps 3-6, then one of 7-22 failing in its third step
    assert "injected failure in step 9" in str(panel.error)
    assert [r.step for r in panel.history] == list(range(1, 9))  # 7 and 8 came from the failed call
    assert panel.step_calls == 4 and "step 9 failed" in panel.status.value
    np.testing.assert_allclose([r.log_density for r in panel.history], reference_log_densities(8), rtol=1e-10)
    assert repr(em_cluster.pull("start")) == repr(panel.model)  # the last good model is back on the ranks
    panel.run(2)  # the wrapped handle steps on: the reference run continues
    np.testing.assert_allclose([r.log_density for r in panel.history], reference_log_densities(10), rtol=1e-10)


@pytest.mark.cluster
def test_the_call_queued_behind_a_failed_one_runs_no_step(em_cluster):
    panel = failing_panel(em_cluster, fail_at=5)
    panel.run(20)  # a call of steps 3-6 failing in its third step, with 7-22 queued behind it
    assert "injected failure in step 5" in str(panel.error) and panel.step_calls == 4
    assert [r.step for r in panel.history] == list(range(1, 5))
    assert em_cluster.run(_failing_handle_steps) == [5, 5]  # the queued call stepped on no rank
    np.testing.assert_allclose([r.log_density for r in panel.history], reference_log_densities(4), rtol=1e-10)
    panel.run(3)
    np.testing.assert_allclose([r.log_density for r in panel.history], reference_log_densities(7), rtol=1e-10)


@pytest.mark.cluster
def test_failed_step_keeps_history_and_the_last_good_model(em_cluster):
    panel = fresh_panel(em_cluster)
    panel.run(2)
    good = panel.model
    em_cluster.push(start="not a model")  # every rank fails in its E-step, before any collective
    with pytest.raises(Exception, match="rank 0"):
        panel.step()
    assert len(panel.history) == 2 and panel.model is good
    assert "failed" in panel.status.value
    panel.step()  # the panel put the last good model back on the ranks
    np.testing.assert_allclose([r.log_density for r in panel.history], reference_log_densities(3), rtol=1e-10)


def test_local_panel_without_a_cluster():
    x, start = em_problem(2000)
    panel = EMPanel(handle=seq_encode(x, model=start), estimator=start.estimator(), model=start, data_sample=x)
    panel.run(3)
    records = []
    optimize(x, start.estimator(), prev_estimate=start, max_its=3, delta=0.0, out=None, on_step=records.append)
    np.testing.assert_allclose([r.log_density for r in panel.history], [r.log_density for r in records], rtol=1e-12)


def test_a_local_panels_history_keeps_its_models_without_what_their_e_steps_prepared():
    """A step keeps a shallow copy of its model (no pickle round trip): the copy drops the kernel
    the model's next E-step builds on the live model, which stays bound on the rank, and the
    steps go on as one process's EM does."""
    x, start = em_problem(2000)
    panel = EMPanel(handle=x, estimator=start.estimator(), model=start)
    panel.run(4)
    live = panel.ranks.namespace[panel.model_name]
    assert live is not panel.history[-1].model
    assert all(r.model._kernel is None for r in panel.history)  # the E-steps ran on the live models
    assert live._kernel is None and panel.step().model is not live  # the step's E-step ran on `live`
    assert live._kernel is not None
    records = []
    optimize(x, start.estimator(), prev_estimate=start, max_its=5, delta=0.0, out=None, on_step=records.append)
    for kept, reference in zip(panel.history, records):
        np.testing.assert_allclose([c.mu for c in kept.model.components], [c.mu for c in reference.model.components])
        np.testing.assert_allclose(kept.model.w, reference.model.w, rtol=1e-12)


def test_names_without_a_running_cluster_say_how_to_start_one(monkeypatch):
    from mixle_nb import cluster as cluster_module

    monkeypatch.setattr(cluster_module, "_current", None)
    with pytest.raises(ValueError, match="no cluster is running: start one with %mixle_cluster start N"):
        EMPanel(handle="h", estimator="est", model="start")


def _make_token_handle(epochs: int = 1):
    from mixle_nb.cluster.rank_side import rank_namespace
    from mixle_nb.parallel import StreamingTokenEncodedData

    ns = rank_namespace()
    ns["th"] = StreamingTokenEncodedData(ns["ids"], block=16, batch_size=8, epochs=epochs, init_process_group=False)
    return ns["th"].total_steps


@pytest.mark.cluster
def test_train_panel_records_progress_per_rank_and_loss_falls(cluster2):
    from mixle_nb.neural import CharTokenizer, StreamingTransformerLeafEstimator, build_causal_lm, stdlib_text

    text = stdlib_text(12_000)
    tokenizer = CharTokenizer.fit(text)
    module = build_causal_lm(tokenizer.vocab_size, d_model=32, n_layer=1, n_head=2, block=16)
    cluster2.push(ids=tokenizer.encode(text), test=StreamingTransformerLeafEstimator(module, lr=1e-2))
    total = cluster2.run(_make_token_handle)[0]
    panel = TrainPanel(
        cluster2,
        handle="th",
        estimator="test",
        tokenizer=tokenizer,
        prompt="The ",
        sample_chars=40,
        chunk_steps=max(total // 4, 1),
        report_every=5,
    )
    panel.train()
    assert panel.error is None
    assert set(panel.curves) == {0, 1}
    assert panel.updates >= 5
    first, last = panel.curves[0][0][1], panel.curves[0][-1][1]
    assert last < first
    assert panel.sample_text.startswith("The ") and len(panel.sample_text) == 44


@pytest.mark.kernel
def test_panel_notebook_stores_widget_state_and_stays_small(tmp_path):
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_code_cell(
            "import numpy as np\n"
            "from mixle_nb.stats import GaussianDistribution, MixtureDistribution, seq_encode\n"
            "from mixle_nb.widgets import EMPanel\n"
            "x = np.random.default_rng(0).normal(size=5000)\n"
            "start = MixtureDistribution([GaussianDistribution(-1, 1), GaussianDistribution(1, 1)], [0.5, 0.5])\n"
            "panel = EMPanel(handle=seq_encode(x, model=start), estimator=start.estimator(), model=start, data_sample=x)\n"
            "panel"
        ),
        nbformat.v4.new_code_cell("panel.run(25)\nlen(panel.history)"),
    ]
    NotebookClient(nb, timeout=120, kernel_name="python3", store_widget_state=True).execute()
    path = tmp_path / "panel.ipynb"
    nbformat.write(nb, path)
    assert path.stat().st_size < 1_000_000
    outputs = nb.cells[0].outputs
    assert any("application/vnd.jupyter.widget-view+json" in o.get("data", {}) for o in outputs)
    state = nb.metadata["widgets"]["application/vnd.jupyter.widget-state+json"]["state"]
    images = [m for m in state.values() if m["model_name"] == "ImageModel"]
    assert len(images) == 1  # one final image per plot, not one per step
    assert nb.cells[1].outputs[0]["data"]["text/plain"] == "25"
    assert "iVBORw0KGgo" in json.dumps(images[0])  # the PNG itself, base64-encoded


@pytest.mark.cluster
def test_cluster_panel_shows_one_row_per_rank(cluster2):
    from mixle_nb.widgets import ClusterPanel

    panel = ClusterPanel(cluster2)
    for row in cluster2.status():
        assert f">{row.pid}<" in panel.table.value
    before = panel.table.value
    cluster2.run(sum, [1, 2])
    panel.refresh_button.click()
    assert panel.table.value != before  # the last call's duration is new


# ---------------------------------------------------------------- history, pictures, redraws


def local_panel(n=2000, **kwargs) -> tuple[EMPanel, np.ndarray]:
    x, start = em_problem(n)
    return EMPanel(
        handle=seq_encode(x, model=start), estimator=start.estimator(), model=start, data_sample=x, **kwargs
    ), x


def test_history_rows_and_csv_hold_every_step(tmp_path):
    import csv

    panel, _ = local_panel()
    panel.run(4)
    rows = panel.history_rows()
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert [r["log_density"] for r in rows] == [r.log_density for r in panel.history]
    assert np.isnan(rows[0]["gain"])
    np.testing.assert_allclose([r["gain"] for r in rows[1:]], np.diff([r.log_density for r in panel.history]))
    assert rows[-1]["model"] == repr(panel.model) and rows[0]["e_step_s_rank0"] > 0
    panel.to_csv(tmp_path / "h.csv")
    with open(tmp_path / "h.csv") as f:
        read = list(csv.DictReader(f))
    assert [float(r["log_density"]) for r in read] == [r["log_density"] for r in rows]
    assert list(read[0]) == list(rows[0])


def _gaussian_mixture(d: int, full: bool):
    from mixle_nb.stats import DiagonalGaussianDistribution, MultivariateGaussianDistribution

    rng = np.random.default_rng(d)
    comps = []
    for _k in range(3):
        mu = rng.normal(0, 5, d)
        if full:
            a = rng.normal(size=(d, d))
            comps.append(MultivariateGaussianDistribution(mu, a @ a.T + d * np.eye(d)))
        else:
            comps.append(DiagonalGaussianDistribution(mu, rng.uniform(0.5, 2, d)))
    return MixtureDistribution(comps, [0.2, 0.3, 0.5])


@pytest.mark.parametrize("full", [True, False])
def test_gaussians_above_two_dimensions_draw_each_component_ellipse(full):
    from mixle_nb.widgets.em_view import EMView

    model = _gaussian_mixture(4, full)
    x = model.sampler(0).sample(1000)
    view = EMView(model, x, distributed=False, picture_dims=(1, 3))
    assert view.picture.kind == "ellipses" and len(view.picture.ellipses) == 3
    for ellipse, comp in zip(view.picture.ellipses, model.components):
        cov = comp.covar if full else np.diag(comp.sigma2)
        sub = cov[np.ix_([1, 3], [1, 3])]
        np.testing.assert_allclose(ellipse.get_center(), comp.mu[[1, 3]], rtol=1e-12)
        np.testing.assert_allclose(
            sorted([ellipse.width, ellipse.height]), 4 * np.sqrt(np.linalg.eigvalsh(sub)), rtol=1e-10
        )
    assert view.render([-10.0, -5.0], model, [0.1])[:4] == b"\x89PNG"
    # without chosen dimensions: the data's first two principal components (scikit-learn's PCA)
    from sklearn.decomposition import PCA

    pca = PCA(2).fit(x)
    view = EMView(model, x, distributed=False)
    projected = view.picture.matrix @ model.components[0].mu
    np.testing.assert_allclose(np.abs(projected), np.abs(pca.components_ @ model.components[0].mu), rtol=1e-8)


def test_rank_bars_show_millisecond_steps_in_milliseconds_at_a_readable_height():
    """A 2-3 ms E-step after a 0.5 s one: bars of 2 and 3 (ms) on an axis that fits them (the
    old axis stayed 0-1 s, so they drew as nothing)."""
    from mixle_nb.widgets.em_view import EMView

    model = _gaussian_mixture(2, True)
    view = EMView(model, model.sampler(0).sample(200), distributed=True)
    view.render([-10.0], model, [0.4, 0.5])
    view.render([-10.0, -5.0], model, [0.002, 0.003])
    assert [p.get_height() for p in view.bars] == pytest.approx([2.0, 3.0], rel=1e-12)
    low, high = view.ranks.get_ylim()
    assert low == 0.0 and 3.0 < high < 10.0 and "ms" in view.ranks.get_title()


def test_one_slow_step_does_not_squash_the_rank_bars_of_the_steps_after_it():
    """A 0.6 s first step (a warm-up) then 2-3 ms steps: the bars' axis fits the recent steps
    (it stayed 0-0.7 s for 20 steps, the bars drawn as nothing), and a step as slow as the
    others is still fitted."""
    from mixle_nb.widgets.em_view import EMView

    model = _gaussian_mixture(2, True)
    view = EMView(model, model.sampler(0).sample(200), distributed=True)
    times = [[0.6, 0.5]] + [[0.002, 0.003]] * 4
    for step in range(1, len(times) + 1):
        view.render([-10.0 + s for s in range(step)], model, times[step - 1], earlier_seconds=times[: step - 1])
    low, high = view.ranks.get_ylim()
    assert low == 0.0 and 3.0 < high < 10.0
    view.render([-10.0] * 6, model, [0.004, 0.005], earlier_seconds=times[1:])
    assert 5.0 < view.ranks.get_ylim()[1] < 12.0


def test_categorical_and_poisson_mixtures_draw_bars_per_component():
    from scipy.stats import poisson

    from mixle_nb.stats import CategoricalDistribution, PoissonDistribution
    from mixle_nb.widgets.em_view import EMView

    cat = MixtureDistribution(
        [
            CategoricalDistribution({"a": 0.7, "b": 0.2, "c": 0.1}),
            CategoricalDistribution({"a": 0.1, "b": 0.3, "c": 0.6}),
        ],
        [0.5, 0.5],
    )
    picture = EMView(cat, None, distributed=False).picture
    assert picture.kind == "categorical" and picture.labels == ["a", "c", "b"]
    assert [[p.get_height() for p in bars] for bars in picture.bars] == [[0.7, 0.1, 0.2], [0.1, 0.6, 0.3]]
    pois = MixtureDistribution([PoissonDistribution(2.0), PoissonDistribution(9.0)], [0.4, 0.6])
    counts = pois.sampler(1).sample(500)
    picture = EMView(pois, counts, distributed=False).picture
    assert picture.kind == "poisson" and picture.labels[-1] >= counts.max()
    for bars, lam in zip(picture.bars, (2.0, 9.0)):
        np.testing.assert_allclose([p.get_height() for p in bars], poisson.pmf(picture.labels, lam), rtol=1e-10)


def test_models_it_cannot_draw_say_so():
    from mixle_nb.stats import CategoricalDistribution, PoissonDistribution
    from mixle_nb.widgets.model_picture import NO_PICTURE

    mixed = MixtureDistribution([PoissonDistribution(2.0), GaussianDistribution(0.0, 1.0)], [0.5, 0.5])
    panel = EMPanel(handle=None, estimator=None, model=mixed)
    assert panel.view.picture.kind is None
    assert any(t.get_text() == NO_PICTURE for t in panel.view.picture.ax.texts)
    assert (
        EMPanel(handle=None, estimator=None, model=CategoricalDistribution({1: 1.0})).view.picture.kind == "categorical"
    )


def test_mixle_models_are_drawn_from_their_parameters():
    mixle_stats = import_or_unavailable("mixle.stats")
    from mixle_nb.widgets.em_view import EMView

    gm = mixle_stats.MixtureDistribution(
        [mixle_stats.GaussianDistribution(-2.0, 1.0), mixle_stats.GaussianDistribution(3.0, 0.5)], [0.4, 0.6]
    )
    view = EMView(gm, None, distributed=False)
    assert view.picture.kind == "density"
    reference = 0.4 * np.exp(-0.5 * (view.picture.grid + 2) ** 2) / np.sqrt(2 * np.pi) + 0.6 * np.exp(
        -0.5 * (view.picture.grid - 3) ** 2 / 0.5
    ) / np.sqrt(2 * np.pi * 0.5)
    np.testing.assert_allclose(view.picture.line.get_ydata(), reference, rtol=1e-12)
    mvn = mixle_stats.MultivariateGaussianDistribution([0.0, 1.0, 2.0], np.diag([1.0, 2.0, 3.0]))
    picture = EMView(mvn, None, distributed=False, picture_dims=(0, 2)).picture
    assert picture.kind == "ellipses"
    np.testing.assert_allclose(sorted([picture.ellipses[0].width, picture.ellipses[0].height]), [4.0, 4 * np.sqrt(3.0)])
    pois = mixle_stats.PoissonDistribution(4.0)
    assert EMView(pois, None, distributed=False).picture.kind == "poisson"


def test_limits_fit_once_for_a_single_value_and_shrink_around_narrow_values():
    from matplotlib.figure import Figure

    from mixle_nb.widgets.axis_limits import LOG_MIN_DECADES, fit_limits

    ax = Figure().subplots()
    assert fit_limits(ax, [-1234.5]) and not fit_limits(ax, [-1234.5])  # one value: fitted once, then kept
    lo, hi = ax.get_ylim()
    assert lo < -1234.5 < hi
    log_ax = Figure().subplots()
    log_ax.set_yscale("log")
    assert fit_limits(log_ax, [3e-2], log=True, min_span=LOG_MIN_DECADES)
    assert not fit_limits(log_ax, [3e-2], log=True, min_span=LOG_MIN_DECADES)
    low, high = np.log10(log_ax.get_ylim())  # at least two decades, centred on the value, with headroom
    assert high - low == pytest.approx(1.5 * LOG_MIN_DECADES) and (low + high) / 2 == pytest.approx(np.log10(3e-2))
    assert fit_limits(ax, [0.0, 1.0]) and ax.get_ylim() == (-0.25, 1.25)
    assert not fit_limits(ax, [0.1, 0.9])  # within, and spanning more than half the axis: kept
    assert fit_limits(ax, [0.2, 0.35]) and ax.get_ylim() == pytest.approx((0.1625, 0.3875))  # less: narrowed
    assert fit_limits(ax, [0.5, 0.51]) and ax.get_ylim() == pytest.approx((0.4975, 0.5125))


def test_limits_of_a_growing_history_only_widen():
    from matplotlib.figure import Figure

    from mixle_nb.widgets.axis_limits import fit_limits

    ax = Figure().subplots()
    ax.set_ylim(10, 20)
    assert fit_limits(ax, [0.0, 2.0]) and ax.get_ylim() == (-0.5, 2.5)  # elsewhere: fitted afresh
    assert not fit_limits(ax, [0.0, 2.0, 0.5])  # the history grew within them: kept
    assert fit_limits(ax, [0.0, 2.0, 0.5, 4.0]) and ax.get_ylim() == (-0.5, 7.0)  # the headroom above, where it grew


def test_a_long_run_paused_early_draws_its_step_axes_to_the_steps_taken():
    """Run N at N = 100,000 paused at about 120 steps: the step axes reach at most twice the
    steps taken (they reached 100,000 before, the curve a sliver at the left edge); Back and
    Reset fit them again to the steps left. While the run goes on they run ahead of it."""
    panel, _ = local_panel(500)
    panel.run(100_000, block=False)
    wait_until(lambda: len(panel.history) >= 120, 60, "120 steps")
    taken = len(panel.history)
    panel.flush()  # drawn mid-run: the axes also hold the steps the next AXES_AHEAD_S will bring,
    # so a run widens them once or twice, not at every doubling (panel_bench's 200-step runs)
    assert panel.view.objective.get_xlim()[1] > 2 * taken + 0.5
    panel.pause()
    panel.wait()
    steps = len(panel.history)
    assert panel.view.objective_line.get_xdata()[-1] == steps
    for ax in (panel.view.objective, panel.view.convergence):
        low, high = ax.get_xlim()
        assert low == 0.5 and steps <= high <= 2 * steps + 0.5, (steps, high)
    panel.back(steps - 7)
    panel.flush()
    assert panel.view.objective.get_xlim() == panel.view.convergence.get_xlim() == (0.5, 10.5)


def test_a_long_run_redraws_its_step_axes_a_logarithmic_number_of_times():
    """Drawn after every step of a 160-step EM history, the step axes' limits only widen (the y
    limits from step 3 on: the gain plot's first fit, of one gain, is centred on it, and
    narrows at step 3 to the side the gains move to, so that they fill half of it), the curves
    span at least half of their axes at every step from 3 on, and their background is redrawn
    about log2(160 / 10) = 4 times for the x axes and as often for the y axes, not at every step."""
    from mixle_nb.widgets.axis_limits import LOG_MIN_DECADES
    from mixle_nb.widgets.em_view import EMView

    x, start = em_problem(500)
    records = []
    optimize(x, start.estimator(), prev_estimate=start, max_its=160, delta=0.0, out=None, on_step=records.append)
    densities = [r.log_density for r in records]
    view = EMView(start, None, distributed=False)
    stale = []
    invalidate = view.live.invalidate
    view.live.invalidate = lambda ax=None, *changed: (stale.append(ax), invalidate(ax, *changed))
    step_axes = (view.objective, view.convergence)
    limits = []
    for i in range(1, len(densities) + 1):
        view.render(densities[:i], start, [0.01])
        limits.append([(*ax.get_xlim(), *ax.get_ylim()) for ax in step_axes])
        if i >= 3:
            for ax, line, log in (
                (view.objective, view.objective_line, False),
                (view.convergence, view.gain_line, True),
            ):
                y = np.asarray(line.get_ydata(), dtype=float)
                low, high = np.log10(ax.get_ylim()) if log else ax.get_ylim()
                y = np.log10(y[y > 0]) if log else y
                span = max(np.ptp(y), LOG_MIN_DECADES) if log else np.ptp(y)  # the least span of a log axis
                assert low <= y.min() and y.max() <= high and span >= 0.5 * (high - low), (i, log)
    low_x, high_x, low_y, high_y = np.asarray(limits).transpose(2, 0, 1)
    assert (np.diff(low_x, axis=0) == 0).all() and (np.diff(high_x, axis=0) >= 0).all()
    assert (np.diff(low_y[2:], axis=0) <= 0).all() and (np.diff(high_y[2:], axis=0) >= 0).all()
    assert high_x[-1].tolist() == [160.5, 160.5]
    for ax in step_axes:
        assert 4 <= stale.count(ax) <= 9, [stale.count(a) for a in step_axes]


def full_draw(live) -> np.ndarray:
    """RGB of one Agg draw of the whole figure, then its dynamic artists: what blitting and
    the background's layers must reproduce."""
    live.canvas.draw()  # leaves out the dynamic (animated) artists
    for artist in live._dynamic:
        if artist.get_visible() and artist.axes is not None:
            artist.axes.draw_artist(artist)
    return np.asarray(live.canvas.buffer_rgba())[..., :3].astype(int)


def test_the_layered_background_shows_what_a_full_draw_shows():
    """Through renders that widen only the step axes (their x axes alone are drawn again), move
    their y limits, change the model and the rank bars, shrink back to no steps, and a loss
    plot gaining a rank, each PNG equals a full draw of the figure to within 1 of 255 per
    channel (the layers' composite rounds once). A layer left stale shows old tick labels."""
    import io

    from PIL import Image

    from mixle_nb.widgets.em_view import EMView
    from mixle_nb.widgets.loss_view import LossView

    def pixels(png):
        return np.asarray(Image.open(io.BytesIO(png)).convert("RGB")).astype(int)

    x, model = em_problem(500)
    records = []
    optimize(x, model.estimator(), prev_estimate=model, max_its=150, delta=0.0, out=None, on_step=records.append)
    models, densities = [model] + [r.model for r in records], [r.log_density for r in records]
    view = EMView(model, x, distributed=True)
    for steps, reach in ((1, None), (12, None), (12, 40), (30, 200), (150, None), (6, None), (0, None)):
        png = view.render(densities[:steps], models[steps], [0.001 * (steps + 1), 0.002], axis_steps=reach)
        assert np.abs(pixels(png) - full_draw(view.live)).max() <= 1, (steps, reach)
    loss = LossView(entropy_floor=1.1)
    for ranks, steps in ((1, 5), (2, 5), (2, 80)):
        png = loss.render(
            {r: [(s, s * 64, 3.0 / s + 1.2 + 0.1 * r) for s in range(1, steps + 1)] for r in range(ranks)},
            [(steps, steps * 64, 1.5)],
        )
        assert np.abs(pixels(png) - full_draw(loss.live)).max() <= 1, (ranks, steps)


def test_png_encoding_is_lossless():
    import io

    from PIL import Image

    from mixle_nb.widgets.live_figure import encode_png

    rgba = np.random.default_rng(0).integers(0, 256, (37, 53, 4), dtype=np.uint8)
    decoded = np.asarray(Image.open(io.BytesIO(encode_png(rgba))).convert("RGB"))
    np.testing.assert_array_equal(decoded, rgba[..., :3])


def test_redraws_are_throttled_and_a_blocking_run_ends_drawn():
    from mixle_nb.widgets.panel import REDRAW_INTERVAL_S

    panel, _ = local_panel(500)
    before = panel.redraws
    t0 = time.monotonic()
    panel.run(200)
    elapsed = time.monotonic() - t0
    sent = panel.redraws - before
    assert 1 <= sent <= elapsed / REDRAW_INTERVAL_S + 2, (sent, elapsed)
    assert f"step 200 · log-density {panel.history[-1].log_density:.6g}" in panel.status.value


def test_costly_redraws_take_a_tenth_of_a_core_yet_come_twice_a_second():
    from mixle_nb.widgets.panel import REDRAW_CPU_SHARE, REDRAW_MAX_INTERVAL_S, Panel, plot_image

    class BurningPanel(Panel):
        """A panel whose render burns ``cpu_s`` of CPU (a redraw whose limits changed)."""

        def __init__(self, cpu_s: float):
            super().__init__()
            self.image, self.cpu_s, self.starts = plot_image(), cpu_s, []

        def _render(self) -> bytes:
            self.starts.append(time.monotonic())
            end = time.thread_time() + self.cpu_s
            while time.thread_time() < end:
                pass
            return b""

    for cpu_s in (0.03, 0.15):
        panel = BurningPanel(cpu_s)
        deadline = time.monotonic() + 3.0
        while time.monotonic() < deadline:  # something new to draw all the time, as in a run
            panel.request_redraw()
            time.sleep(0.01)
        gaps = np.diff(panel.starts)
        spacing = min(cpu_s / REDRAW_CPU_SHARE, REDRAW_MAX_INTERVAL_S)  # 0.3 s, then the cap 0.5 s (not 1.5)
        assert len(gaps) >= 3 and gaps.min() >= 0.95 * spacing, (cpu_s, gaps)
        assert np.median(gaps) < spacing + 0.3, (cpu_s, gaps)


def interrupt_run(panel, after_s: float, elsewhere: bool = False) -> int:
    """Ctrl-C ``after_s`` into a blocking ``panel.run`` (see ``interrupt_after``): it raises, and
    no step follows; the steps done."""
    with kernel_interrupts(), pytest.raises(KeyboardInterrupt):
        interrupt_after(after_s, elsewhere)
        panel.run(100_000)
    assert not panel.running
    steps = len(panel.history)
    time.sleep(1.0)
    assert len(panel.history) == steps and 0 < steps < 100_000
    return steps


def test_ctrl_c_during_a_blocking_local_run_stops_the_worker():
    panel, _ = local_panel(20_000)
    interrupt_run(panel, 1.0)


def test_ctrl_c_delivered_to_another_thread_still_stops_a_blocking_run():
    """A CI run once waited out all 100,000 steps: the SIGINT went to a thread other than the
    main one, which slept in a lock wait that only a signal of its own would wake."""
    panel, _ = local_panel(20_000)
    interrupt_run(panel, 1.0, elsewhere=True)


def test_train_panel_locally_with_held_out_loss_entropy_floor_and_targets(tmp_path):
    import torch
    import torch.nn.functional as F

    from mixle_nb.neural import CharTokenizer, StreamingTransformerLeafEstimator, build_causal_lm, stdlib_text
    from mixle_nb.parallel import StreamingTokenEncodedData

    text = stdlib_text(6_000)
    tokenizer = CharTokenizer.fit(text)
    ids = tokenizer.encode(text)
    torch.manual_seed(0)
    module = build_causal_lm(tokenizer.vocab_size, d_model=16, n_layer=1, n_head=2, block=8)
    train = StreamingTokenEncodedData(ids[:5000], block=8, batch_size=8, epochs=1, init_process_group=False)
    held = StreamingTokenEncodedData(ids[5000:], block=8, batch_size=64, epochs=1, init_process_group=False)
    panel = TrainPanel(
        handle=train,
        estimator=StreamingTransformerLeafEstimator(module, lr=1e-2),
        validation=held,
        entropy_floor=1.0,
        report_every=5,
        x_axis="targets",
        log_scale=True,
    )
    panel.train()
    assert panel.error is None
    # held-out loss against a direct computation over every held-out window
    tokens = np.asarray(ids[5000:], dtype=np.int64)
    starts = np.arange(len(tokens) - 8)
    ctx = torch.as_tensor(np.stack([tokens[s : s + 8] for s in starts]))
    module.eval()
    with torch.no_grad():
        reference = F.cross_entropy(module(ctx).float(), torch.as_tensor(tokens[starts + 8])).item()
    assert len(panel.held_out) == 1
    np.testing.assert_allclose(panel.held_out[0][2], reference, rtol=1e-5)
    steps, targets, _ = panel.points[0][-1]
    assert targets == steps * 8 * 8  # batch_size windows of block targets a step
    rows = panel.history_rows()
    assert {r["kind"] for r in rows} == {"train", "held-out"}
    assert sum(r["kind"] == "train" for r in rows) == len(panel.points[0])
    panel.to_csv(tmp_path / "loss.csv")
    assert (tmp_path / "loss.csv").read_text().startswith("kind,rank,step,targets,loss")
    assert panel.view.ax.get_yscale() == "log" and "targets" in panel.view.ax.get_xlabel()
    panel.x_axis.value = "steps"  # the toggle rebuilds the view
    panel.flush()
    assert panel.view.ax.get_xlabel() == "optimizer step"
    assert any(abs(line.get_ydata()[0] - 1.0) < 1e-12 for line in panel.view.ax.lines if line.get_linestyle() == "--")


def test_local_train_panel_attach_loads_the_kept_weights_into_the_new_module():
    import torch

    from mixle_nb.neural import CharTokenizer, StreamingTransformerLeafEstimator, build_causal_lm, stdlib_text
    from mixle_nb.parallel import StreamingTokenEncodedData

    text = stdlib_text(3_000)
    tokenizer = CharTokenizer.fit(text)
    ids = tokenizer.encode(text)

    def handle():
        return StreamingTokenEncodedData(ids, block=8, batch_size=8, epochs=1, init_process_group=False)

    def fresh_module():
        torch.manual_seed(0)
        return build_causal_lm(tokenizer.vocab_size, d_model=16, n_layer=1, n_head=2, block=8)

    trained = fresh_module()
    panel = TrainPanel(handle=handle(), estimator=StreamingTransformerLeafEstimator(trained, lr=1e-2))
    panel.train()
    first = handle()
    assert panel.error is None and panel.model_state_step == first.total_steps
    for k, v in trained.state_dict().items():  # kept: a copy of the trained weights
        assert torch.equal(panel.model_state[k], v) and panel.model_state[k].data_ptr() != v.data_ptr()
    untrained = fresh_module()
    assert not all(torch.equal(untrained.state_dict()[k], v) for k, v in trained.state_dict().items())
    panel.attach(handle=handle(), estimator=StreamingTransformerLeafEstimator(untrained, lr=1e-2))
    assert all(torch.equal(untrained.state_dict()[k], v) for k, v in trained.state_dict().items())
    assert f"weights of step {first.total_steps}" in panel.status.value


def test_local_train_panel_stop_ends_training_after_the_current_step_and_train_goes_on():
    """A local panel trains in one call to the end of the epochs; Stop reaches that call's
    training loop (the handle's stop flag), not only the gap between calls: Stop at step 1's
    report ends the run after step 2, and Train then goes on to the end."""
    from mixle_nb.neural import CharTokenizer, StreamingTransformerLeafEstimator, build_causal_lm, stdlib_text
    from mixle_nb.parallel import StreamingTokenEncodedData

    text = stdlib_text(1_500)
    tokenizer = CharTokenizer.fit(text)
    handle = StreamingTokenEncodedData(
        tokenizer.encode(text), block=8, batch_size=8, epochs=1, init_process_group=False
    )
    module = build_causal_lm(tokenizer.vocab_size, d_model=16, n_layer=1, n_head=2, block=8, seed=0)
    estimator = StreamingTransformerLeafEstimator(module, lr=1e-2)
    with pytest.raises(ValueError, match="elastic=True needs a cluster"):
        TrainPanel(handle=handle, estimator=estimator, elastic=True)
    panel = TrainPanel(handle=handle, estimator=estimator, report_every=1)
    record = panel.ranks.on_data

    def record_then_stop(data: dict) -> None:
        record(data)
        panel.stop()

    panel.ranks.on_data = record_then_stop
    panel.train()
    assert panel.error is None
    assert [step for step, _ in panel.curves[0]] == [1, 2] and panel.model_state_step == 2
    assert handle.stop is None and handle.max_steps is None  # the handle's own settings are back
    panel.ranks.on_data = record
    panel.train()
    assert [step for step, _ in panel.curves[0]] == list(range(1, handle.total_steps + 1))
    assert panel.model_state_step == handle.total_steps


# ---------------------------------------------------------------- interrupts and dead ranks


@pytest.mark.cluster
def test_ctrl_c_during_a_blocking_cluster_run_stops_worker_and_ranks(em_cluster):
    pids = sorted(row.pid for row in em_cluster.status())
    panel = fresh_panel(em_cluster)
    steps = interrupt_run(panel, 1.5)
    assert "interrupted" in panel.status.value
    assert em_cluster.state.value == "running" and sorted(row.pid for row in em_cluster.status()) == pids
    panel.run(2)  # the ranks hold the last good model: the steps continue the reference run
    np.testing.assert_allclose([r.log_density for r in panel.history], reference_log_densities(steps + 2), rtol=1e-10)


def _push_long_training(cluster):
    """A token handle ``th`` and an estimator ``test`` on the ranks, long enough to interrupt
    (four epochs of 156 steps; a CI run once finished the one epoch it had before the kill);
    returns ``(tokenizer, text, module)`` to rebuild them."""
    from mixle_nb.neural import CharTokenizer, StreamingTransformerLeafEstimator, build_causal_lm, stdlib_text

    text = stdlib_text(40_000)
    tokenizer = CharTokenizer.fit(text)
    module = build_causal_lm(tokenizer.vocab_size, d_model=32, n_layer=1, n_head=2, block=16)
    cluster.push(ids=tokenizer.encode(text), test=StreamingTransformerLeafEstimator(module, lr=1e-2))
    cluster.run(_make_token_handle, 4)
    return tokenizer, text, module


@pytest.mark.cluster
def test_ctrl_c_during_blocking_training_stops_worker_and_ranks(cluster2):
    import os
    import signal
    import threading

    _push_long_training(cluster2)
    pids = sorted(row.pid for row in cluster2.status())
    panel = TrainPanel(cluster2, handle="th", estimator="test", chunk_steps=1000, report_every=2)

    def interrupt_once_training():
        wait_until(lambda: len(panel.curves.get(0, [])) >= 2, 120, "two progress reports")
        os.kill(os.getpid(), signal.SIGINT)

    threading.Thread(target=interrupt_once_training, daemon=True).start()
    with kernel_interrupts(), pytest.raises(KeyboardInterrupt):
        panel.train()
    assert not panel.running and "interrupted" in panel.status.value
    reports = len(panel.curves[0])
    time.sleep(1.0)
    assert len(panel.curves[0]) == reports
    assert cluster2.state == "running" and sorted(row.pid for row in cluster2.status()) == pids
    assert cluster2.run(sum, [1, 2]) == [3, 3]  # the next call works


def _engine_pid(cluster, rank: int) -> int:
    return next(row.pid for row in cluster.status() if row.rank == rank)


def _rebuild_em_handle(cluster) -> None:
    x, start = em_problem()
    cluster.push(x=x, est=start.estimator(), start=start)
    assert sum(cluster.run(_make_em_handle)) == len(x)


@pytest.fixture
def cluster_to_kill(cluster2):
    """The session cluster for a test that kills a rank: should the test fail before its own
    ``restart()``, the cluster is restarted and its EM handle rebuilt after, so that the failure
    stays this test's alone."""
    yield cluster2
    if cluster2.state != "running" or not all(row.alive for row in cluster2.status()):
        cluster2.restart()
        _rebuild_em_handle(cluster2)


@pytest.mark.cluster
def test_kill_9_during_a_run_shows_rank_died_then_attach_continues(em_cluster, cluster_to_kill):
    import os
    import signal

    from mixle_nb.cluster import RankDiedError

    panel = fresh_panel(em_cluster)
    panel.run(100_000, block=False)
    wait_until(lambda: len(panel.history) >= 3, 60, "three steps of the run")
    os.kill(_engine_pid(em_cluster, 1), signal.SIGKILL)
    killed = time.monotonic()
    panel.wait(30)
    assert not panel.running and time.monotonic() - killed < 10
    assert isinstance(panel.error, RankDiedError) and panel.error.ranks == [1]
    assert "RankDiedError" in panel.status.value and "attach" in panel.status.value
    kept = len(panel.history)
    good = panel.model
    assert kept >= 3 and good is panel.history[-1].model
    # a run sent to the broken cluster fails at its first send, as a step fails: shown, nothing lost
    # (its worker once raised it unseen, leaving the error of the run before)
    first_error = panel.error
    panel.run(2)
    assert panel.error is not first_error and isinstance(panel.error, RankDiedError)
    assert len(panel.history) == kept and "RankDiedError" in panel.status.value
    em_cluster.restart()
    _rebuild_em_handle(em_cluster)
    panel.attach(em_cluster, handle="h", estimator="est")
    assert len(panel.history) == kept and panel.error is None
    panel.run(2)
    np.testing.assert_allclose([r.log_density for r in panel.history], reference_log_densities(kept + 2), rtol=1e-10)


def _module_state(estimator: str) -> dict:
    """On a rank: the named estimator's module weights, as numpy arrays."""
    from mixle_nb.cluster.rank_side import lookup

    return {k: v.detach().cpu().numpy() for k, v in lookup(estimator).module.state_dict().items()}


@pytest.mark.cluster
def test_kill_9_during_training_keeps_the_curves_and_attach_continues_from_the_kept_weights(cluster_to_kill):
    cluster = cluster_to_kill
    import os
    import signal

    from mixle_nb.cluster import RankDiedError
    from mixle_nb.neural import StreamingTransformerLeafEstimator

    tokenizer, text, module = _push_long_training(cluster)
    panel = TrainPanel(cluster, handle="th", estimator="test", chunk_steps=20, report_every=2)
    panel.train(block=False)
    wait_until(
        lambda: panel.model_state is not None and len(panel.curves.get(0, [])) >= 12,
        120,
        "a finished chunk and twelve progress reports",
    )
    assert panel.running, "training ended before the kill: give it more steps"
    os.kill(_engine_pid(cluster, 1), signal.SIGKILL)
    panel.wait(30)
    assert not panel.running
    assert isinstance(panel.error, RankDiedError) and "RankDiedError" in panel.status.value
    assert len(panel.curves[0]) >= 3 and len(panel.history_rows()) >= 3
    # the new handle's steps count on from the last step any rank reported (the killed rank's
    # reports may run one ahead of rank 0's: a CI-like run once saw 145 == 112 + 31)
    kept = max(curve[-1][0] for curve in panel.curves.values())
    assert panel.model_state_step % 20 == 0 and 20 <= panel.model_state_step <= kept
    trained_loss = dict(panel.curves[0])[panel.model_state_step]
    untrained_loss = panel.curves[0][0][1]
    cluster.restart()
    # the estimator pushed again carries the untrained module, as a notebook's re-run cell would
    cluster.push(ids=tokenizer.encode(text[:8000]), test=StreamingTransformerLeafEstimator(module, lr=1e-2))
    total = cluster.run(_make_token_handle)[0]
    panel.attach(cluster, handle="th", estimator="test")
    assert f"weights of step {panel.model_state_step}" in panel.status.value
    for state in cluster.run(_module_state, "test"):  # every rank now holds the kept weights
        assert state.keys() == panel.model_state.keys()
        assert all(np.array_equal(state[k], panel.model_state[k].numpy()) for k in state)
    panel.train()
    assert panel.error is None
    assert panel.curves[0][-1][0] == kept + total  # the new handle's steps counted on
    # training continued from the kept weights: the first loss after attach is near the trained
    # loss, not back at the untrained one
    resumed_loss = next(loss for step, loss in panel.curves[0] if step > kept)
    assert resumed_loss < (trained_loss + untrained_loss) / 2, (untrained_loss, trained_loss, resumed_loss)
    _rebuild_em_handle(cluster)  # leave the module's EM handle as em_cluster made it


# ---------------------------------------------------------------- starts and the choice of K


def _four_clusters(n=4000):
    rng = np.random.default_rng(3)
    x = np.concatenate([rng.normal(m, 1.0, n // 4) for m in (-10, -3, 3, 10)])
    est = MixtureDistribution([GaussianDistribution(0, 1)] * 4, [0.25] * 4).estimator()
    return x, est


def test_local_init_choice_and_choose_k_plot_bic_against_k():
    from mixle_nb.inference import bic, initial_model

    x, est = _four_clusters()
    enc = seq_encode(x, estimator=est)
    panel = EMPanel(handle=enc, estimator=est, init="kmeans++", seed=5, data_sample=x, model_selection=True)
    assert repr(panel.start_model) == repr(initial_model(enc, est, "kmeans++", rng=5))
    assert "Init" in panel.buttons and "Choose K" in panel.buttons
    panel.run(3)
    panel.initialize("random", seed=1)
    assert panel.history == [] and repr(panel.model) == repr(initial_model(enc, est, "random", rng=1))
    panel.choose_k(5, seed=0)
    k = panel.k_choice
    assert k["k"] == [1, 2, 3, 4, 5] and k["best_k"] == 4
    for model, score in zip(k["models"], k["bic"]):  # scored as inference.bic scores them
        np.testing.assert_allclose(
            score,
            bic(
                x,
                model,
                MixtureDistribution(
                    [GaussianDistribution(0, 1)] * len(model.components),
                    [1 / len(model.components)] * len(model.components),
                ).estimator(),
            ),
            rtol=1e-12,
        )
    assert panel.k_image.value[:4] == b"\x89PNG" and panel.k_image in panel.widget.children
    assert "BIC chooses K = 4" in panel.status.value
    with pytest.raises(ValueError, match="not both and not neither"):
        EMPanel(handle=enc, estimator=est)


def _make_four_cluster_handle():
    from mixle_nb.cluster.rank_side import rank_namespace
    from mixle_nb.parallel import TorchRunEncodedData

    ns = rank_namespace()
    ns["h4"] = TorchRunEncodedData(ns["x4"], estimator=ns["est4"])


@pytest.mark.cluster
def test_cluster_init_and_choose_k(cluster2):
    from mixle_nb.inference import choose_k

    x, est = _four_clusters()
    cluster2.push(x4=x, est4=est)
    cluster2.run(_make_four_cluster_handle)
    panel = EMPanel(cluster2, handle="h4", estimator="est4", init="kmeans++", seed=2, model_selection=True)
    starts = cluster2.pull("_mixle_panel_model", rank="all")
    assert repr(starts[0]) == repr(starts[1]) == repr(panel.start_model)  # identical on every rank
    panel.run(5)
    panel.choose_k(5, seed=0)
    assert panel.k_choice["best_k"] == 4 and len(panel.k_choice["bic"]) == 5
    single = choose_k(x, lambda k: type(est)([est.estimators[0]] * k), range(1, 6), init="kmeans++", rng=0, out=None)
    assert single.best_k == 4
    np.testing.assert_allclose(panel.k_choice["bic"][3], single.bic[3], rtol=1e-6)


# ---------------------------------------------------------------- mixle's own models


def _make_mixle_handle():
    from mixle_nb.cluster.rank_side import rank_namespace
    from mixle_nb.parallel import TorchRunEncodedData

    ns = rank_namespace()
    ns["hm"] = TorchRunEncodedData(ns["xm"], estimator=ns["estm"])


@pytest.mark.cluster
def test_em_panel_steps_a_mixle_model_on_the_cluster_and_shows_mixle_errors_like_ours(cluster2):
    mixle_stats = import_or_unavailable("mixle.stats")

    x, _ = em_problem(4000)
    start = mixle_stats.MixtureDistribution(
        [mixle_stats.GaussianDistribution(-1.0, 1.0), mixle_stats.GaussianDistribution(1.0, 1.0)], [0.5, 0.5]
    )
    cluster2.push(xm=x, estm=start.estimator(), startm=start)
    cluster2.run(_make_mixle_handle)
    panel = EMPanel(cluster2, handle="hm", estimator="estm", model="startm")
    assert panel.view.picture.kind == "density"
    panel.run(3)
    assert panel.error is None and len(panel.history) == 3
    # each step's log-density is that of the model it started from, as mixle itself computes it
    mixle_enc = start.dist_to_encoder().seq_encode(x)
    starts = [start] + [r.model for r in panel.history[:-1]]
    np.testing.assert_allclose(
        [r.log_density for r in panel.history],
        [float(np.sum(m.seq_log_density(mixle_enc))) for m in starts],
        rtol=1e-10,
    )
    # a mixle model this panel cannot draw still steps, with its log-density curve
    cluster2.push(
        startm=mixle_stats.MixtureDistribution(
            [mixle_stats.GaussianDistribution(0.0, 1.0), mixle_stats.ExponentialDistribution(1.0)], [0.5, 0.5]
        )
    )
    odd = EMPanel(cluster2, handle="hm", estimator="estm", model="startm")
    assert odd.view.picture.kind is None
    # mixle's own error, raised on the ranks, is shown as ours are: which rank, which error
    cluster2.push(startm=mixle_stats.CategoricalDistribution({"a": 1.0}))
    bad = EMPanel(cluster2, handle="hm", estimator="estm", model="startm")
    with pytest.raises(Exception, match="rank 0"):
        bad.step()
    assert "step 1 failed: RankError: rank 0 raised" in bad.status.value and bad.history == []
