"""The EM panel steps a hidden Markov model: its picture (the transition heat map, each
state's emission over the data, a sequence coloured by its Viterbi states) read back from the
figure's artists against hmmlearn's numbers for the same model; Choose K picks the number of
states by BIC, scored as hmmlearn scores (samples, not sequences); locally and on 2 ranks."""

from __future__ import annotations

import numpy as np
import pytest
from matplotlib.colors import to_rgba_array
from scipy import stats
from strictness import import_or_unavailable

from mixle_nb.stats import GaussianDistribution
from mixle_nb.stats.hmm import HiddenMarkovDistribution
from mixle_nb.widgets import EMPanel
from mixle_nb.widgets.em_view import EMView
from mixle_nb.widgets.model_picture import COLOURS

hmmlearn_hmm = import_or_unavailable("hmmlearn.hmm")

TRANSMAT = [[0.9, 0.05, 0.05], [0.05, 0.9, 0.05], [0.1, 0.1, 0.8]]
LENGTHS = (140, 110, 80, 50)


def sequences() -> list:
    """Four 1-D sequences of three well separated states."""
    truth = HiddenMarkovDistribution(
        [GaussianDistribution(-3.0, 0.4), GaussianDistribution(0.0, 0.4), GaussianDistribution(4.0, 1.0)],
        [0.4, 0.3, 0.3],
        TRANSMAT,
    )
    rng = np.random.default_rng(3)
    return [truth.sample_sequence(rng, n)[0] for n in LENGTHS]


def start() -> HiddenMarkovDistribution:
    return HiddenMarkovDistribution(
        [GaussianDistribution(-1.0, 2.0), GaussianDistribution(0.5, 2.0), GaussianDistribution(2.0, 2.0)],
        [1 / 3, 1 / 3, 1 / 3],
        [[0.6, 0.2, 0.2], [0.2, 0.6, 0.2], [0.2, 0.2, 0.6]],
    )


def hmmlearn_of(model: HiddenMarkovDistribution):
    """hmmlearn's GaussianHMM with ``model``'s numbers."""
    h = hmmlearn_hmm.GaussianHMM(model.n_states, covariance_type="diag", init_params="")
    h.startprob_, h.transmat_ = model.startprob, model.transmat
    h.means_ = np.array([[e.mu] for e in model.emissions])
    h.covars_ = np.array([[e.sigma2] for e in model.emissions])
    h.n_features = 1
    return h


def assert_picture_is(view: EMView, model: HiddenMarkovDistribution, sequence: np.ndarray) -> None:
    """Heat map and cell values are ``transmat``; the points' colours are hmmlearn's Viterbi
    path; each state's curve is its weight (mean posterior, hmmlearn's) times its density."""
    picture = view.picture
    assert picture.kind == "hmm" and picture.emissions.kind == "density"
    np.testing.assert_array_equal(picture.heat.get_array(), model.transmat)
    assert [[c.get_text() for c in row] for row in picture.cells] == [[f"{p:.2f}" for p in r] for r in model.transmat]
    h, x = hmmlearn_of(model), np.asarray(sequence, dtype=float).reshape(-1, 1)
    path = h.decode(x, algorithm="viterbi")[1]
    assert len(set(path)) > 1  # the colours tell states apart
    np.testing.assert_array_equal(picture.points.get_facecolors(), to_rgba_array([COLOURS[s] for s in path]))
    weights, grid = h.predict_proba(x).mean(axis=0), picture.emissions.grid
    for line, w, e in zip(picture.emissions.part_lines, weights, model.emissions):
        expected = w * stats.norm.pdf(grid, e.mu, np.sqrt(e.sigma2))
        np.testing.assert_allclose(line.get_ydata(), expected, rtol=1e-8, atol=1e-12)
    np.testing.assert_allclose(
        picture.emissions.line.get_ydata(), sum(ln.get_ydata() for ln in picture.emissions.part_lines)
    )


def test_a_local_panel_steps_an_hmm_and_draws_what_hmmlearn_computes():
    seqs = sequences()
    panel = EMPanel(handle=seqs, estimator=start().estimator(), model=start(), model_selection=True)
    np.testing.assert_array_equal(panel.data_sample.reshape(-1), seqs[0])  # the first sequence is drawn
    panel.run(4)
    history = [r.log_density for r in panel.history]
    x, lengths = np.concatenate(seqs)[:, None], [len(s) for s in seqs]
    assert history[0] == pytest.approx(hmmlearn_of(start()).score(x, lengths), rel=1e-10)
    assert np.all(np.diff(history) >= 0)
    assert_picture_is(panel.view, panel.model, seqs[0])
    assert panel.view.live.png()[:4] == b"\x89PNG"
    # Choose K: BIC over samples, as hmmlearn's; three states win
    panel.choose_k(4, seed=0)
    k = panel.k_choice
    assert k["k"] == [1, 2, 3, 4] and k["best_k"] == 3
    for model, score in zip(k["models"], k["bic"]):
        assert score == pytest.approx(hmmlearn_of(model).bic(x, lengths), rel=1e-10)
    assert "BIC chooses K = 3" in panel.status.value
    # a k-means start for the states' emissions: centres near the true means, a uniform chain
    started = EMPanel(handle=seqs, estimator=start().estimator(), init="kmeans++", seed=0).start_model
    np.testing.assert_allclose(sorted(e.mu for e in started.emissions), [-3.0, 0.0, 4.0], atol=0.3)
    np.testing.assert_array_equal(started.transmat, np.full((3, 3), 1 / 3))


def test_categorical_and_poisson_states_draw_bars_and_viterbi_colours():
    from mixle_nb.hmm import CategoricalHMM, PoissonHMM

    c = CategoricalHMM(2, init_params="")
    c.startprob_, c.transmat_ = np.array([0.5, 0.5]), np.array([[0.8, 0.2], [0.3, 0.7]])
    c.emissionprob_ = np.array([[0.7, 0.2, 0.1], [0.1, 0.3, 0.6]])
    symbols = c.sample(120, random_state=2)[0]
    view = EMView(c._model(), symbols[:, 0], distributed=False)
    bars = view.picture.emissions
    assert bars.kind == "categorical" and bars.part == "state"
    for patches, row in zip(bars.bars, c.emissionprob_):
        np.testing.assert_allclose([p.get_height() for p in patches], [row[s] for s in bars.labels], rtol=1e-12)
    path = c.decode(symbols)[1]
    np.testing.assert_array_equal(view.picture.points.get_facecolors(), to_rgba_array([COLOURS[s] for s in path]))

    p = PoissonHMM(2, init_params="")
    p.startprob_, p.transmat_, p.lambdas_ = (
        np.array([0.5, 0.5]),
        np.array([[0.9, 0.1], [0.2, 0.8]]),
        np.array([[1.5], [7.0]]),
    )
    counts = p.sample(150, random_state=4)[0]
    view = EMView(p._model(), counts, distributed=False)
    bars = view.picture.emissions
    assert bars.kind == "poisson" and bars.labels[-1] >= counts.max()
    for patches, lam in zip(bars.bars, p.lambdas_[:, 0]):
        np.testing.assert_allclose([b.get_height() for b in patches], stats.poisson.pmf(bars.labels, lam), rtol=1e-10)
    path = p.decode(counts)[1]
    np.testing.assert_array_equal(view.picture.points.get_facecolors(), to_rgba_array([COLOURS[s] for s in path]))
    assert set(path) == {0, 1}


def _make_sequence_handle():
    """On a rank: the pushed sequences, whole, shared out between the ranks."""
    from mixle_nb.cluster.rank_side import rank_namespace
    from mixle_nb.parallel import TorchRunEncodedData

    ns = rank_namespace()
    ns["hs"] = TorchRunEncodedData(ns["seqs"], estimator=ns["hmm_est"])
    ns["hg"] = TorchRunEncodedData([s[:, None] for s in ns["seqs"]], estimator=ns["face"].family_estimator())
    return ns["hs"].local_count


@pytest.mark.cluster
def test_a_cluster_panel_steps_an_hmm_on_a_handle_of_sequences(cluster2):
    seqs = sequences()
    cluster2.push(seqs=seqs, hmm_est=start().estimator(), hmm_start=start(), face=face_of(start()))
    assert sorted(cluster2.run(_make_sequence_handle)) == [2, 2]
    panel = EMPanel(cluster2, handle="hs", estimator="hmm_est", model="hmm_start", model_selection=True)
    panel.run(4)
    local = EMPanel(handle=seqs, estimator=start().estimator(), model=start())
    local.run(4)
    np.testing.assert_allclose(
        [r.log_density for r in panel.history], [r.log_density for r in local.history], rtol=1e-10
    )
    first = panel.data_sample.reshape(-1)  # rank 0's first sequence, whole
    assert any(len(s) == len(first) and np.array_equal(s, first) for s in seqs)
    assert_picture_is(panel.view, panel.model, first)
    panel.choose_k(3, seed=0)
    assert panel.k_choice["best_k"] == 3
    x, lengths = np.concatenate(seqs)[:, None], [len(s) for s in seqs]
    best = panel.k_choice["models"][2]
    assert panel.k_choice["bic"][2] == pytest.approx(hmmlearn_of(best).bic(x, lengths), rel=1e-8)
    # hmmlearn's API on the cluster: fit(cluster.handle(name)) runs where the sequences live
    on_ranks, here = face_of(start()).fit(cluster2.handle("hg")), face_of(start()).fit(x, lengths)
    for name in ("startprob_", "transmat_", "means_", "covars_"):
        np.testing.assert_allclose(getattr(on_ranks, name), getattr(here, name), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(on_ranks.monitor_.history, here.monitor_.history, rtol=1e-10)


def face_of(model: HiddenMarkovDistribution):
    """Our GaussianHMM (hmmlearn's API) started at ``model``, 5 iterations."""
    from mixle_nb.hmm import GaussianHMM

    m = GaussianHMM(model.n_states, covariance_type="diag", init_params="", n_iter=5, tol=-np.inf)
    m.startprob_, m.transmat_ = model.startprob, model.transmat
    m.means_ = np.array([[e.mu] for e in model.emissions])
    m.covars_ = np.array([[e.sigma2] for e in model.emissions])
    m.n_features = 1  # a fit on a handle does not see the data's width
    return m


def gmm_face(covariance_type: str, means: np.ndarray, covars: np.ndarray):
    """Our GMMHMM (two states of two components) and hmmlearn's, with the same numbers."""
    from mixle_nb.hmm import GMMHMM

    faces = (GMMHMM(2, n_mix=2, covariance_type=covariance_type, init_params=""),) + (
        hmmlearn_hmm.GMMHMM(2, n_mix=2, covariance_type=covariance_type, init_params=""),
    )
    for face in faces:
        face.startprob_, face.transmat_ = np.array([0.6, 0.4]), np.array([[0.9, 0.1], [0.15, 0.85]])
        face.weights_, face.means_, face.covars_ = np.array([[0.3, 0.7], [0.55, 0.45]]), means, covars
        face.n_features = means.shape[-1]
    return faces


def test_gmmhmm_states_draw_their_mixture_density_in_1d_and_component_ellipses_in_2d():
    ours, theirs = gmm_face(
        "diag", np.array([[[-3.0], [-1.0]], [[2.0], [4.5]]]), np.array([[[0.5], [0.3]], [[0.4], [1.2]]])
    )
    x = ours.sample(300, random_state=1)[0]
    view = EMView(ours._model(), x, distributed=False)
    picture = view.picture.emissions
    assert picture.kind == "density" and len(picture.part_lines) == 2  # a curve per state, not per component
    shares = ours.predict_proba(x).mean(axis=0)
    np.testing.assert_allclose(shares, theirs.predict_proba(x).mean(axis=0), rtol=1e-8)
    grid = picture.grid
    for k, line in enumerate(picture.part_lines):  # the state's share times its mixture's closed-form density
        density = sum(
            w * stats.norm.pdf(grid, mu[0], np.sqrt(var[0]))
            for w, mu, var in zip(ours.weights_[k], ours.means_[k], ours.covars_[k])
        )
        np.testing.assert_allclose(line.get_ydata(), shares[k] * density, rtol=1e-12, atol=1e-300)
    np.testing.assert_allclose(picture.line.get_ydata(), sum(ln.get_ydata() for ln in picture.part_lines), rtol=1e-12)
    path = theirs.decode(x)[1]
    np.testing.assert_array_equal(view.picture.points.get_facecolors(), to_rgba_array([COLOURS[s] for s in path]))

    covars = np.array(
        [[[[1.0, 0.3], [0.3, 0.5]], [[0.4, -0.1], [-0.1, 0.8]]], [[[0.6, 0.0], [0.0, 0.6]], [[2.0, 0.9], [0.9, 1.0]]]]
    )
    ours, theirs = gmm_face("full", np.array([[[-3.0, 0.0], [-1.0, 2.0]], [[2.0, 2.0], [4.0, -1.0]]]), covars)
    x = ours.sample(200, random_state=2)[0]
    picture = EMView(ours._model(), x, distributed=False).picture.emissions
    assert picture.kind == "ellipses" and len(picture.ellipses) == 4  # one per mixture component
    shares = theirs.predict_proba(x).mean(axis=0)
    for i, ellipse in enumerate(picture.ellipses):
        k, j = divmod(i, 2)
        np.testing.assert_array_equal(ellipse.get_edgecolor(), to_rgba_array(COLOURS[k])[0])  # the state's colour
        np.testing.assert_allclose(ellipse.get_center(), theirs.means_[k, j], rtol=1e-12)
        np.testing.assert_allclose(
            sorted([ellipse.width, ellipse.height]), 4 * np.sqrt(np.linalg.eigvalsh(covars[k, j])), rtol=1e-12
        )
        assert ellipse.get_linewidth() == pytest.approx(1 + 3 * shares[k] * ours.weights_[k, j], rel=1e-8)


def test_the_panel_starts_and_chooses_k_for_tied_gaussian_mixture_states():
    """Init's k-means‖ start and Choose K for a GMMHMM family with ``"tied"`` covariances: the
    start's means are the data's six clusters (two a state), and every fit ties each state's
    components, never two states; BIC picks the three states the data hold."""
    from mixle_nb.stats.hmm import gaussian_mixture_estimator

    rng = np.random.default_rng(5)
    centres = np.array([[0.0, 0.0], [12.0, 0.0], [0.0, 12.0]])
    seqs = []
    for n in (60, 45, 30):
        states = rng.integers(0, 3, size=n)
        side = np.where(rng.random((n, 1)) < 0.5, -3.0, 3.0) * [1.0, 0.0]
        seqs.append(centres[states] + side + 0.5 * rng.normal(size=(n, 2)))
    family = gaussian_mixture_estimator(3, 2, "tied", dim=2)
    panel = EMPanel(handle=seqs, estimator=family, init="kmeans++", seed=0, model_selection=True)
    means = np.concatenate([[c.mu for c in state.components] for state in panel.start_model.emissions])
    truth = np.concatenate([centres - [3.0, 0.0], centres + [3.0, 0.0]])
    assert np.abs(means[:, None, :] - truth[None]).sum(axis=2).min(axis=0).max() < 0.5  # every cluster found
    panel.choose_k(3, seed=0)
    assert panel.k_choice["best_k"] == 3
    for model in panel.k_choice["models"]:
        covars = [state.components[0].covar for state in model.emissions]
        for state, covar in zip(model.emissions, covars):
            np.testing.assert_allclose(state.components[1].covar, covar, rtol=1e-12)
        assert all(np.abs(a - b).max() > 1e-3 for i, a in enumerate(covars) for b in covars[:i])
