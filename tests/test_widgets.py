"""EMPanel and TrainPanel on a real 2-engine cluster, and a panel notebook run by nbclient."""
from __future__ import annotations

import json

import nbformat
import numpy as np
import pytest
from nbclient import NotebookClient

from mixle_nb.inference import optimize
from mixle_nb.stats import GaussianDistribution, MixtureDistribution, seq_encode
from mixle_nb.widgets import EMPanel, TrainPanel

pytestmark = pytest.mark.cluster


def em_problem(n=20_000):
    rng = np.random.default_rng(0)
    x = np.concatenate([rng.normal(-2, 1, n // 2), rng.normal(3, 0.7, n - n // 2)])
    start = MixtureDistribution([GaussianDistribution(-1, 1), GaussianDistribution(0.5, 1),
                                 GaussianDistribution(2, 1)], [0.3, 0.3, 0.4])
    return x, start


def _make_em_handle():
    """On a rank: shard the pushed data into a resident handle named `h`."""
    from mixle_nb.parallel import TorchRunEncodedData
    from mixle_nb.cluster.rank_side import rank_namespace

    ns = rank_namespace()
    ns["h"] = TorchRunEncodedData(ns["x"], estimator=ns["est"])
    return ns["h"].local_count


@pytest.fixture(scope="module")
def em_cluster(cluster2):
    x, start = em_problem()
    cluster2.push(x=x, est=start.estimator(), start=start)
    assert sum(cluster2.run(_make_em_handle)) == len(x)
    return cluster2


def fresh_panel(cluster) -> EMPanel:
    """A panel on the shared handle, started from the start model (earlier panels advanced it)."""
    cluster.push(start=em_problem()[1])
    return EMPanel(cluster, handle="h", estimator="est", model="start")


def reference_log_densities(steps: int) -> list:
    x, start = em_problem()
    records = []
    optimize(x, start.estimator(), prev_estimate=start, max_its=steps, delta=0.0, out=None,
             on_step=records.append)
    return [r.log_density for r in records]


def test_em_panel_matches_single_process_and_never_decreases(em_cluster):
    panel = fresh_panel(em_cluster)
    panel.step()
    panel.run(5)
    assert [r.step for r in panel.history] == list(range(1, 7))
    np.testing.assert_allclose([r.log_density for r in panel.history], reference_log_densities(6), rtol=1e-10)
    assert np.all(np.diff([r.log_density for r in panel.history]) >= 0)
    assert all(len(r.rank_seconds) == 2 for r in panel.history)
    assert panel.image.value[:4] == b"\x89PNG"


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


def test_pause_stops_a_run_within_one_step(em_cluster):
    panel = fresh_panel(em_cluster)
    panel.run(10_000, block=False)
    while len(panel.history) < 2:
        panel.wait(0.05)
    seen = len(panel.history)
    panel.pause()
    panel.wait(30)
    assert not panel.running
    assert len(panel.history) <= seen + 1


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


def test_names_without_a_running_cluster_say_how_to_start_one(monkeypatch):
    from mixle_nb import cluster as cluster_module

    monkeypatch.setattr(cluster_module, "_current", None)
    with pytest.raises(ValueError, match="no cluster is running: start one with %mixle_cluster start N"):
        EMPanel(handle="h", estimator="est", model="start")


def _make_token_handle():
    from mixle_nb.parallel import StreamingTokenEncodedData
    from mixle_nb.cluster.rank_side import rank_namespace

    ns = rank_namespace()
    ns["th"] = StreamingTokenEncodedData(ns["ids"], block=16, batch_size=8, epochs=1,
                                         init_process_group=False)
    return ns["th"].total_steps


def test_train_panel_records_progress_per_rank_and_loss_falls(cluster2):
    from mixle_nb.neural import CharTokenizer, StreamingTransformerLeafEstimator, build_causal_lm, stdlib_text

    text = stdlib_text(12_000)
    tokenizer = CharTokenizer.fit(text)
    module = build_causal_lm(tokenizer.vocab_size, d_model=32, n_layer=1, n_head=2, block=16)
    cluster2.push(ids=tokenizer.encode(text), test=StreamingTransformerLeafEstimator(module, lr=1e-2))
    total = cluster2.run(_make_token_handle)[0]
    panel = TrainPanel(cluster2, handle="th", estimator="test", tokenizer=tokenizer, prompt="The ",
                       sample_chars=40, chunk_steps=max(total // 4, 1), report_every=5)
    panel.train()
    assert panel.error is None
    assert set(panel.curves) == {0, 1}
    assert panel.updates >= 5
    first, last = panel.curves[0][0][1], panel.curves[0][-1][1]
    assert last < first
    assert panel.sample_text.startswith("The ") and len(panel.sample_text) == 44


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
            "panel"),
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


def test_cluster_panel_shows_one_row_per_rank(cluster2):
    from mixle_nb.widgets import ClusterPanel

    panel = ClusterPanel(cluster2)
    for row in cluster2.status():
        assert f">{row.pid}<" in panel.table.value
    before = panel.table.value
    cluster2.run(sum, [1, 2])
    panel.refresh_button.click()
    assert panel.table.value != before  # the last call's duration is new
