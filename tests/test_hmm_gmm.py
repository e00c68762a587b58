"""GMMHMM (a Gaussian mixture per state) against hmmlearn 0.3.3's from the same start: every
fitted attribute within 1e-8, both implementations, every covariance type, two (states,
components) shapes, with and without priors, every ``params``; the inference calls, BIC/AIC,
sampling draw for draw and hmmlearn's errors; the log-density never falls; the family in
mixle_nb.stats (free parameters, tied covariances, decoding, sampling); a 2-rank handle equal to
one process within 1e-10, and ``fit(cluster.handle(name))`` on the cluster."""

from __future__ import annotations

import numpy as np
import pytest

hmmlearn_hmm = pytest.importorskip("hmmlearn.hmm")

from mixle_nb import hmm as ours  # noqa: E402
from mixle_nb.parallel.local_launch import run_local  # noqa: E402
from mixle_nb.stats import em_step, free_parameters  # noqa: E402
from mixle_nb.stats.hmm import HiddenMarkovDistribution  # noqa: E402
from mixle_nb.stats.hmm.gaussian_mixture_emission import (  # noqa: E402
    gaussian_mixture_arrays,
    gaussian_mixture_estimator,
    gaussian_mixture_states,
)

LENGTHS = [40, 7, 1, 25, 60, 17]
TOL = 1e-8
COVARIANCE_TYPES = ("spherical", "diag", "full", "tied")
ATTRIBUTES = ("startprob_", "transmat_", "weights_", "means_", "covars_")


def gmm_data(d: int = 2, seed: int = 0) -> np.ndarray:
    """Three clusters, each of two sub-clusters 1.5 apart, in ``d`` dimensions."""
    rng = np.random.default_rng(seed)
    centres = np.array([[0.0] * d, [3.0] * d, [-2.0] + [1.0] * (d - 1)])
    states = rng.integers(0, 3, size=sum(LENGTHS))
    return centres[states] + rng.normal(size=(len(states), d)) + 1.5 * rng.integers(0, 2, size=(len(states), 1))


def separated_data(seed: int = 0) -> np.ndarray:
    """Three states 12 apart, each of two components 6 apart, of spread 0.5: every k-means
    draw ends in the same partition, so starts agree to rounding however they are drawn."""
    rng = np.random.default_rng(seed)
    centres = np.array([[0.0, 0.0], [12.0, 0.0], [0.0, 12.0]])
    states = rng.integers(0, 3, size=sum(LENGTHS))
    side = np.where(rng.random((len(states), 1)) < 0.5, -3.0, 3.0) * [1.0, 0.0]
    return centres[states] + side + 0.5 * rng.normal(size=(len(states), 2))


def canonical_means(means: np.ndarray) -> np.ndarray:
    """``means_`` (K, M, 2) with the states, and each state's components, in the order of
    their coordinates (two starts' labels differ)."""
    states = means[np.lexsort(means.mean(axis=1).T[::-1])]
    order = np.argsort(states[:, :, 0], axis=1)  # a state's components lie apart along x
    return np.take_along_axis(states, order[:, :, None], axis=1)


def handle_fit(covariance_type: str, n_iter: int, implementation: str = "log", **handle_options):
    """``GMMHMM(3, n_mix=2)`` with nothing set, fitted on a handle of the separated data."""
    from mixle_nb.parallel import TorchRunEncodedData

    seqs = np.split(separated_data(), np.cumsum(LENGTHS)[:-1])
    family = gaussian_mixture_estimator(3, 2, covariance_type, dim=2)
    m = ours.GMMHMM(
        3, n_mix=2, covariance_type=covariance_type, implementation=implementation, random_state=0, n_iter=n_iter
    )
    with TorchRunEncodedData(seqs, estimator=family, **handle_options) as handle:
        return m.fit(handle), handle.local_count


def gmm_start(cls, covariance_type, implementation="log", n_components=3, n_mix=2, d=2, **kw):
    """A model of ``cls`` at a fixed start (seeded, so hmmlearn's and ours are equal)."""
    rng = np.random.default_rng(n_components * 10 + n_mix)
    kw = {"init_params": "", "n_iter": 6, "tol": -np.inf, **kw}
    m = cls(n_components, n_mix=n_mix, covariance_type=covariance_type, implementation=implementation, **kw)
    m.startprob_ = np.full(n_components, 1.0 / n_components)
    m.transmat_ = 0.6 * np.eye(n_components) + 0.4 / n_components
    m.weights_ = rng.dirichlet(np.full(n_mix, 3.0), size=n_components)
    m.means_ = rng.normal(size=(n_components, n_mix, d)) * 2
    scales = rng.uniform(0.7, 1.5, size=(n_components, n_mix))
    m.covars_ = {
        "spherical": scales,
        "diag": scales[:, :, None] * np.linspace(1.0, 1.4, d),
        "full": scales[:, :, None, None] * np.eye(d) + 0.1,
        "tied": scales[:, 0, None, None] * np.eye(d) + 0.2,
    }[covariance_type]
    return m


def assert_attributes(a, b, names=ATTRIBUTES, tol=TOL):
    for name in names:
        np.testing.assert_allclose(getattr(a, name), getattr(b, name), rtol=0, atol=tol, err_msg=name)


def assert_inference(a, b, X, lengths):
    assert a.score(X, lengths) == pytest.approx(b.score(X, lengths), rel=1e-12)
    la, pa = a.score_samples(X, lengths)
    lb, pb = b.score_samples(X, lengths)
    assert la == pytest.approx(lb, rel=1e-12)
    np.testing.assert_allclose(pa, pb, atol=1e-10)
    np.testing.assert_allclose(a.predict_proba(X, lengths), pb, atol=1e-10)
    for algorithm in ("viterbi", "map"):
        va, sa = a.decode(X, lengths, algorithm=algorithm)
        vb, sb = b.decode(X, lengths, algorithm=algorithm)
        assert va == pytest.approx(vb, rel=1e-12)
        np.testing.assert_array_equal(sa, sb)
    np.testing.assert_array_equal(a.predict(X, lengths), b.predict(X, lengths))
    assert a.bic(X, lengths) == pytest.approx(b.bic(X, lengths), rel=1e-12)
    assert a.aic(X, lengths) == pytest.approx(b.aic(X, lengths), rel=1e-12)


@pytest.mark.parametrize("implementation", ["log", "scaling"])
@pytest.mark.parametrize("covariance_type", COVARIANCE_TYPES)
def test_fit_equals_hmmlearn(covariance_type, implementation):
    X = gmm_data()
    for n_components, n_mix in ((3, 2), (2, 3)):
        shape = dict(n_components=n_components, n_mix=n_mix)
        a = gmm_start(ours.GMMHMM, covariance_type, implementation, **shape).fit(X, LENGTHS)
        b = gmm_start(hmmlearn_hmm.GMMHMM, covariance_type, implementation, **shape).fit(X, LENGTHS)
        assert_attributes(a, b)
        assert a.covars_.shape == b.covars_.shape
        np.testing.assert_allclose(list(a.monitor_.history), list(b.monitor_.history), rtol=1e-12)
        assert a.monitor_.iter == b.monitor_.iter == 6
    assert_inference(a, b, X, LENGTHS)


@pytest.mark.parametrize("params", ["stmcw", "w", "m", "c"])
def test_params_subsets_and_priors(params):
    X = gmm_data()
    for covariance_type in COVARIANCE_TYPES:
        full = covariance_type in ("full", "tied")
        priors = dict(
            weights_prior=1.5,
            means_prior=0.3,
            means_weight=2.0,
            covars_prior=0.4 * np.eye(2) if full else 0.4,
            covars_weight=4.0 if full else 2.0,
            transmat_prior=1.2,
            startprob_prior=2.0,
        )
        a = gmm_start(ours.GMMHMM, covariance_type, "scaling", params=params, **priors).fit(X, LENGTHS)
        b = gmm_start(hmmlearn_hmm.GMMHMM, covariance_type, "scaling", params=params, **priors).fit(X, LENGTHS)
        assert_attributes(a, b)


def test_three_features_far_from_the_origin():
    """D = 3, and the data and start moved to 1e4: the centred sums keep hmmlearn's digits."""
    X = gmm_data(d=3, seed=6)
    a = gmm_start(ours.GMMHMM, "full", "log", d=3)
    a.means_ = a.means_ + 1e4
    a.fit(X + 1e4, LENGTHS)
    b = gmm_start(hmmlearn_hmm.GMMHMM, "full", "log", d=3).fit(X, LENGTHS)
    np.testing.assert_allclose(a.means_ - 1e4, b.means_, rtol=0, atol=1e-8)
    assert_attributes(a, b, ("startprob_", "transmat_", "weights_", "covars_"))


def test_log_density_never_falls():
    X = gmm_data()
    for covariance_type in COVARIANCE_TYPES:
        m = ours.GMMHMM(3, n_mix=2, covariance_type=covariance_type, n_iter=25, tol=-np.inf, random_state=3)
        history = np.array(m.fit(X, LENGTHS).monitor_.history)
        assert len(history) == 25
        assert np.all(np.diff(history) >= -1e-9 * np.abs(history[1:])), covariance_type


def test_the_start_as_hmmlearn_makes_it():
    """``init_params``: the chain's Dirichlet draws, uniform weights, k-means of the states and
    of the components within each, the data's covariance in each type's shape."""
    X = gmm_data()
    for covariance_type in COVARIANCE_TYPES:
        a = ours.GMMHMM(3, n_mix=2, covariance_type=covariance_type, n_iter=0, random_state=5).fit(X, LENGTHS)
        b = hmmlearn_hmm.GMMHMM(3, n_mix=2, covariance_type=covariance_type, n_iter=0, random_state=5)
        b.fit(X, LENGTHS)
        assert_attributes(a, b, tol=1e-12)


def test_sample_matches_hmmlearn_draw_for_draw():
    for covariance_type in COVARIANCE_TYPES:
        xa, sa = gmm_start(ours.GMMHMM, covariance_type).sample(40, random_state=7)
        xb, sb = gmm_start(hmmlearn_hmm.GMMHMM, covariance_type).sample(40, random_state=7)
        np.testing.assert_array_equal(sa, sb)
        np.testing.assert_allclose(xa, xb, atol=1e-12)


@pytest.mark.parametrize(
    ("attribute", "value", "message"),
    [
        ("weights_", np.full((3, 3), 1 / 3), r"weights_ must have shape \(n_components, n_mix\)"),
        ("weights_", np.full((3, 2), 0.4), "weights_ rows must sum to 1"),
        ("means_", np.zeros((3, 2, 3)), r"means_ must have shape \(n_components, n_mix, n_features\)"),
        ("covars_", np.ones((3, 2, 2)), r"'full' mixture covars must have shape \(3, 2, 2, 2\)"),
        ("covars_", np.tile([[1.0, 0.5], [0.0, 1.0]], (3, 2, 1, 1)), "state #0, mixture #0 is not symmetric"),
        ("covars_", np.tile([[1.0, 2.0], [2.0, 1.0]], (3, 2, 1, 1)), "state #0, mixture #0 is not positive definite"),
        ("transmat_", np.full((3, 3), 0.5), "transmat_ rows must sum to 1"),
    ],
)
def test_hmmlearn_errors_before_any_work(attribute, value, message):
    X = gmm_data()
    for cls in (ours.GMMHMM, hmmlearn_hmm.GMMHMM):
        m = gmm_start(cls, "full")
        setattr(m, attribute, value)
        with pytest.raises(ValueError, match=message):
            m.fit(X, LENGTHS)


def test_other_errors():
    m = gmm_start(ours.GMMHMM, "diag")
    m.covars_ = -m.covars_
    with pytest.raises(ValueError, match="'diag' mixture covars must be non-negative"):
        m.fit(gmm_data(), LENGTHS)
    m = gmm_start(ours.GMMHMM, "diag")
    m.covariance_type = "bad"
    with pytest.raises(ValueError, match="covariance_type must be one of"):
        m.score(gmm_data(), LENGTHS)
    with pytest.raises(ValueError, match="doesn't sum to"):
        gmm_start(ours.GMMHMM, "diag").fit(gmm_data(), [3, 4])
    bad = gmm_data()
    bad[50, 1] = np.nan
    with pytest.raises(ValueError, match="sequence 3, position 2"):
        gmm_start(ours.GMMHMM, "diag").fit(bad, LENGTHS)
    m = gmm_start(ours.GMMHMM, "diag", n_mix=3)
    m.weights_ = np.array([[0.5, 0.5, 0.0], [0.2, 0.3, 0.5], [0.4, 0.3, 0.3]])  # hmmlearn: NaN covariances
    with pytest.raises(ValueError, match="state 0, mixture component 2: .* posterior mass of 0"):
        m.fit(gmm_data(), LENGTHS)
    with pytest.raises(ValueError, match=r"weights_prior|broadcast"):
        gmm_start(ours.GMMHMM, "diag", weights_prior=np.ones(5)).fit(gmm_data(), LENGTHS)


def test_the_family_in_stats():
    """The Gaussian-mixture HMM family itself: arrays to models and back, free parameters of
    each covariance type, a maximum-likelihood fit that never falls and ties a state's
    covariance for ``"tied"``, decoding and sampling of whole sequences."""
    K, M, D = 3, 2, 2
    for covariance_type, per_component, per_state in (
        ("spherical", D + 1, 0),
        ("diag", 2 * D, 0),
        ("full", D + D * (D + 1) // 2, 0),
        ("tied", D, D * (D + 1) // 2),
    ):
        face = gmm_start(ours.GMMHMM, covariance_type)
        states = gaussian_mixture_states(face.weights_, face.means_, face.covars_, covariance_type)
        for got, want in zip(
            gaussian_mixture_arrays(states, covariance_type), (face.weights_, face.means_, face.covars_)
        ):
            np.testing.assert_array_equal(got, want)
        start = HiddenMarkovDistribution(states, face.startprob_, face.transmat_, length=30)
        estimator = gaussian_mixture_estimator(K, M, covariance_type, dim=D, reg_covar=0.0)
        enc = start.dist_to_encoder().seq_encode(list(start.sampler(1).sample(12)))
        model, history = start, []
        for _ in range(8):
            step = em_step(enc, estimator, model)
            model, history = step.model, [*history, step.log_density]
        assert np.all(np.diff(history) >= -1e-9 * np.abs(history[1:])), covariance_type
        expected = (K - 1) + K * (K - 1) + K * ((M - 1) + M * per_component + per_state)
        assert free_parameters(estimator, model) == expected, covariance_type
        if covariance_type == "tied":
            for state in model.emissions:
                np.testing.assert_allclose(state.components[0].covar, state.components[1].covar, rtol=1e-12)
        x, path = model.sample_sequence(np.random.default_rng(0), 50)
        assert x.shape == (50, D) and set(path) <= set(range(K))
        _, decoded = model.seq_viterbi(model.dist_to_encoder().seq_encode([x]))
        assert decoded.shape == (50,)
    with pytest.raises(ValueError, match="covariance_type must be one of"):
        gaussian_mixture_estimator(2, 2, "round")


@pytest.mark.parametrize("covariance_type", COVARIANCE_TYPES)
def test_a_handle_starts_an_unset_model_as_hmmlearn_starts_the_arrays(covariance_type):
    """On a handle (one process), nothing set: uniform weights, the two-level k-means‖ means
    equal to hmmlearn's scikit-learn k-means start on data whose partition is clear, the
    data's covariance (denominator n) plus min_covar in every component; then EM runs."""
    X = separated_data()
    m, _ = handle_fit(covariance_type, 0, init_process_group=False)
    theirs = hmmlearn_hmm.GMMHMM(3, n_mix=2, covariance_type=covariance_type, random_state=0, n_iter=0)
    theirs.fit(X, LENGTHS)
    np.testing.assert_array_equal(m.weights_, np.full((3, 2), 0.5))
    np.testing.assert_allclose(canonical_means(m.means_), canonical_means(theirs.means_), rtol=0, atol=1e-10)
    cv = np.cov(X.T, bias=True) + 1e-3 * np.eye(2)
    if covariance_type in ("spherical", "diag"):
        expected = np.full((3, 2), cv.mean()) if covariance_type == "spherical" else np.tile(np.diag(cv), (3, 2, 1))
    else:
        expected = np.broadcast_to(cv, theirs.covars_.shape)
    np.testing.assert_allclose(m.covars_, expected, rtol=1e-12)
    fitted, _ = handle_fit(covariance_type, 3, init_process_group=False)
    assert fitted.monitor_.iter == 3 and np.all(np.diff(fitted.monitor_.history) >= 0)


UNSET_FITS = (("tied", "log", 0), ("diag", "scaling", 0), ("tied", "log", 4))  # type, implementation, n_iter


def _two_rank_fit(rank, world):
    from mixle_nb.hmm import GMMHMM
    from mixle_nb.parallel import TorchRunEncodedData

    X = gmm_data()
    seqs = np.split(X, np.cumsum(LENGTHS)[:-1])
    out = {}
    for covariance_type, implementation in (("full", "log"), ("diag", "scaling")):
        m = gmm_start(GMMHMM, covariance_type, implementation)
        with TorchRunEncodedData(seqs, estimator=m.family_estimator()) as handle:
            m.fit(handle)
            out["local_sequences"] = handle.local_count
        out[covariance_type] = [np.asarray(getattr(m, name)) for name in ATTRIBUTES], list(m.monitor_.history)
    for covariance_type, implementation, n_iter in UNSET_FITS:  # nothing set: started here
        m, _ = handle_fit(covariance_type, n_iter, implementation)
        out["unset", covariance_type, n_iter] = [np.asarray(getattr(m, name)) for name in ATTRIBUTES]
    return out


@pytest.mark.ranks
def test_two_rank_handle_fit_equals_one_process():
    results = run_local(_two_rank_fit, 2, timeout=240)
    assert sorted(r["local_sequences"] for r in results) == [3, 3]
    X = gmm_data()
    for covariance_type, implementation in (("full", "log"), ("diag", "scaling")):
        single = gmm_start(ours.GMMHMM, covariance_type, implementation).fit(X, LENGTHS)
        for r in results:
            attributes, history = r[covariance_type]
            for name, got in zip(ATTRIBUTES, attributes):
                np.testing.assert_allclose(got, getattr(single, name), rtol=1e-10, atol=1e-12, err_msg=name)
            np.testing.assert_allclose(history, list(single.monitor_.history), rtol=1e-10)
        for got, same in zip(results[0][covariance_type][0], results[1][covariance_type][0]):
            np.testing.assert_array_equal(got, same)
    for covariance_type, implementation, n_iter in UNSET_FITS:  # the k-means‖ start, and a fit from it
        single, _ = handle_fit(covariance_type, n_iter, implementation, init_process_group=False)
        for r in results:
            for name, got in zip(ATTRIBUTES, r["unset", covariance_type, n_iter]):
                np.testing.assert_allclose(got, getattr(single, name), rtol=1e-10, atol=1e-12, err_msg=name)


def _make_gmm_handle():
    """On a rank: the pushed sequences, whole, shared out between the ranks."""
    from mixle_nb.cluster.rank_side import rank_namespace
    from mixle_nb.parallel import TorchRunEncodedData

    ns = rank_namespace()
    ns["gmm_handle"] = TorchRunEncodedData(ns["gmm_seqs"], estimator=ns["gmm_face"].family_estimator())
    return ns["gmm_handle"].local_count


@pytest.mark.cluster
def test_fit_on_the_cluster_handle_equals_one_process(cluster2):
    X = separated_data()
    cluster2.push(gmm_seqs=np.split(X, np.cumsum(LENGTHS)[:-1]), gmm_face=gmm_start(ours.GMMHMM, "tied"))
    assert sorted(cluster2.run(_make_gmm_handle)) == [3, 3]
    on_ranks = gmm_start(ours.GMMHMM, "tied").fit(cluster2.handle("gmm_handle"))
    here = gmm_start(ours.GMMHMM, "tied").fit(X, LENGTHS)
    for name in ATTRIBUTES:
        np.testing.assert_allclose(getattr(on_ranks, name), getattr(here, name), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(on_ranks.monitor_.history, here.monitor_.history, rtol=1e-10)
    # nothing set: the k-means‖ start runs on the ranks too
    unset = ours.GMMHMM(3, n_mix=2, covariance_type="tied", random_state=0, n_iter=4)
    unset.fit(cluster2.handle("gmm_handle"))
    single, _ = handle_fit("tied", 4, init_process_group=False)
    for name in ATTRIBUTES:
        np.testing.assert_allclose(getattr(unset, name), getattr(single, name), rtol=1e-10, atol=1e-12)
    cluster2.run(_close_gmm_handle)


def _close_gmm_handle():
    """On a rank: close and forget the test's handle."""
    from mixle_nb.cluster.rank_side import rank_namespace

    rank_namespace().pop("gmm_handle").close()


def test_choosing_k_with_tied_covariances_ties_them_within_each_state_as_hmmlearn():
    """Choose K fits K states of copies of the first state's family: with ``"tied"`` each
    state's components share a covariance and the states keep their own (hmmlearn's
    ``GMMHMM`` meaning). From our K = 3 fit, our EM step equals hmmlearn's (which takes the
    scatter about the means it started at: the same, to 1e-9, where EM has converged); the
    BIC is hmmlearn's log-likelihood and covariance count."""
    from functools import partial

    from mixle_nb.inference import choose_k
    from mixle_nb.stats.hmm import states_of_copies
    from mixle_nb.stats.hmm.gaussian_mixture_emission import StateTiedMixtureEstimator

    X = separated_data()
    seqs = np.split(X, np.cumsum(LENGTHS)[:-1])
    family = gaussian_mixture_estimator(3, 2, "tied", dim=2, reg_covar=0.0)
    found = choose_k(
        seqs, partial(states_of_copies, family), [2, 3], init="kmeans++", rng=0, out=None, tol=1e-10, max_its=200
    )
    assert found.best_k == 3
    model = found.results[1].model
    covars = [state.components[0].covar for state in model.emissions]
    for state, covar in zip(model.emissions, covars):
        np.testing.assert_allclose(state.components[1].covar, covar, rtol=1e-12)  # tied within the state
    assert min(np.abs(a - b).max() for i, a in enumerate(covars) for b in covars[:i]) > 1e-3  # not across states
    theirs = hmmlearn_hmm.GMMHMM(3, n_mix=2, covariance_type="tied", init_params="", n_iter=1, tol=-np.inf)
    theirs.startprob_, theirs.transmat_ = model.startprob, model.transmat
    theirs.weights_, theirs.means_, theirs.covars_ = gaussian_mixture_arrays(model.emissions, "tied")
    theirs.fit(X, LENGTHS)  # one step of hmmlearn's EM from our fit (its scatter about the means it started at)
    step = em_step(model.dist_to_encoder().seq_encode(seqs), states_of_copies(family, 3), model).model
    for got, want in zip(
        (step.startprob, step.transmat, *gaussian_mixture_arrays(step.emissions, "tied")),
        (theirs.startprob_, theirs.transmat_, theirs.weights_, theirs.means_, theirs.covars_),
    ):
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-9)
    n_fit = theirs._get_n_fit_scalars_per_param()
    assert n_fit["c"] == 3 * 3  # one covariance per state, D (D + 1) / 2 = 3 numbers each
    # hmmlearn 0.3.3 counts one state's weights (n_mix - 1) where K (n_mix - 1) are fitted
    ours_count = free_parameters(states_of_copies(family, 3), model)
    assert ours_count == sum(n_fit.values()) + (3 - 1) * (2 - 1)
    assert found.bic[1] == pytest.approx(theirs.bic(X, LENGTHS) + 2 * np.log(len(X)), rel=1e-9)
    # a GMMHMM's own family copies as tied within each state too (the panel's Choose K copies it)
    face = gmm_start(ours.GMMHMM, "tied")
    face.n_features = 2
    assert all(
        isinstance(state, StateTiedMixtureEstimator)
        for state in states_of_copies(face.family_estimator(), 4).estimators
    )
