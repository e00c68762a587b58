"""The float32 E-step (``dtype="float32"``, issue 39): what it keeps of the numerics guarantees.

Every check is against the float64 E-step or the float64 objective, at stated tolerances
(docs/guide/numerics.md, "float32"): a float32 fit agrees with the float64 fit from the same
start to ``AGREE`` (weights; means in spreads; covariances in spreads²) while the data's extent
is within 1e3 of the components' spreads; data at offsets 1e4 and 1e6 give the fit at 0 moved,
and data in units 1e3 times smaller or larger the fit scaled, within the same ``AGREE``; EM never lowers the float64 objective by more than ``DOWNHILL`` per
observation; the encoded data take half the bytes. The Bayesian mixture's float32 fit agrees
with its float64 fit to the same ``AGREE`` and its lower bound to ``BOUND_NOISE`` per
observation, and both mixtures' ``partial_fit`` take float32 from their input as ``fit`` does.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from offset_data import KINDS, estimator_and_start, full_covariances, offset_problem

from mixle_nb.mixture import BayesianGaussianMixture, GaussianMixture
from mixle_nb.stats import (
    DiagonalGaussianEstimator,
    GaussianEstimator,
    MixtureDistribution,
    MixtureEstimator,
    MultivariateGaussianEstimator,
    PoissonEstimator,
    SphericalGaussianEstimator,
    em_step,
    seq_encode,
    seq_log_density_sum,
)

AGREE = 1e-5  # float32 against float64 fits, and a float32 fit at an offset against it at 0
# the Bayesian mixture's 100 iterations (tol=0) at an offset of 1e4: measured at most 5e-6 on the
# CPU this was first measured on and 2.0e-5 (diag and spherical covariances) on an AVX2-only AMD EPYC,
# whose float32 products round in another order
BAYESIAN_AGREE = 5e-5
DOWNHILL = 1e-7  # the float64 objective per observation may fall by this much in a float32 step
# the float32 E-step's objective per observation against the float64 one: 1e-6, and 2e-8 per
# spread of the data's extent (a point's rounding, |x - o|·6e-8, moves its log-density by z·that)
OBJECTIVE, OBJECTIVE_PER_EXTENT = 1e-6, 2e-8
STEPS = 25
# the Bayesian mixture's float32 lower bound (a total, as scikit-learn's) per observation: within this
# of the float64 fit's, and it may fall between iterations by as much (float32's rounding of the
# responsibilities' entropy; measured at most 1.3e-6 and 1.2e-6; float64's never falls)
BOUND_NOISE = 5e-6
PRIOR_TYPES = ("dirichlet_process", "dirichlet_distribution")


def _em(p, kind, dtype, steps=STEPS, model=None, reg_covar=1e-6):
    """``steps`` EM iterations in ``dtype`` from the problem's start; the model, the E-step's
    own log-density of each step's model, and each step's model's float64 log-density."""
    estimator, start = estimator_and_start(p, kind, reg_covar)
    estimator = MixtureEstimator(estimator.estimators, dtype=dtype)
    x = p.x[:, 0] if p.x.shape[1] == 1 and kind in ("full", "tied") else p.x
    enc = seq_encode(x, estimator=estimator)
    exact = seq_encode(x, estimator=MixtureEstimator(estimator.estimators, dtype="float64"))
    model = start if model is None else model
    own, float64 = [], []
    for _ in range(steps):
        float64.append(seq_log_density_sum(exact, model)[1])
        step = em_step(enc, estimator, model)
        own.append(step.log_density)
        model = step.model
    return model, np.array(own), np.array(float64)


def _largest_differences(a, b, offset=0.0, unit=1.0):
    """Weights, means (less ``offset``, in ``unit``) and covariances (in ``unit``²) of two fits:
    their largest differences."""
    (wa, ma, ca), (wb, mb, cb) = full_covariances(a), full_covariances(b)
    return np.abs(wa - wb).max(), np.abs((ma - offset) / unit - mb).max(), np.abs(ca / unit**2 - cb).max()


@pytest.mark.parametrize("spelling", [torch.float32, "float32", np.float32, np.dtype("float32")])
def test_float32_is_accepted_in_every_spelling(spelling):
    for estimator in (
        GaussianEstimator(dtype=spelling),
        DiagonalGaussianEstimator(dtype=spelling),
        SphericalGaussianEstimator(dtype=spelling),
        MultivariateGaussianEstimator(dtype=spelling),
    ):
        assert estimator.dtype == torch.float32
    assert MixtureEstimator([GaussianEstimator()], dtype=spelling).dtype == torch.float32
    assert GaussianEstimator().dtype == torch.float64  # the default


@pytest.mark.parametrize("bad", ["float16", torch.float16, np.int64, "single precision", 3])
def test_another_dtype_is_refused_naming_the_choices(bad):
    with pytest.raises(ValueError, match=r"dtype must be float64 \(the default\) or float32 .*; got"):
        DiagonalGaussianEstimator(dtype=bad)
    x = np.random.default_rng(0).normal(size=(20, 2))
    for estimator in (GaussianMixture(dtype=bad), BayesianGaussianMixture(dtype=bad)):
        for method in (estimator.fit, estimator.partial_fit):
            with pytest.raises(ValueError, match=r"dtype"):  # scikit-learn's message for a wrong type, else ours
                method(x)


def test_a_mixture_dtype_needs_components_of_our_gaussian_families():
    estimator = MixtureEstimator([PoissonEstimator()] * 2, dtype="float32")
    with pytest.raises(ValueError, match="dtype= takes components of our Gaussian families"):
        seq_encode(np.array([1, 2, 3]), estimator=estimator)


@pytest.mark.parametrize(
    "dim, estimator", [(1, GaussianEstimator), (8, DiagonalGaussianEstimator), (8, MultivariateGaussianEstimator)]
)
def test_the_float32_encoding_takes_half_the_bytes(dim, estimator):
    x = np.random.default_rng(0).normal(1e6, 1.0, size=(1000, dim))
    data = x[:, 0] if dim == 1 else x

    def size(enc):
        tensors = [enc.values] + ([] if enc.features is None else [enc.features])
        return sum(t.element_size() * t.nelement() for t in tensors)

    wide, narrow = (seq_encode(data, estimator=estimator(dtype=d)) for d in ("float64", "float32"))
    assert narrow.values.dtype == torch.float32 and wide.values.dtype == torch.float64
    assert (narrow.features is None) == (wide.features is None) == (estimator is not MultivariateGaussianEstimator)
    assert size(narrow) * 2 == size(wide)
    np.testing.assert_allclose(narrow.points.numpy(), wide.points.numpy(), rtol=0, atol=4 * 6e-8 * 4)  # x - o rounded


@pytest.mark.parametrize("dim, kind", [(1, "full"), *((3, kind) for kind in KINDS), (8, "full"), (8, "diag")])
@pytest.mark.parametrize("separation", [2.0, 1e3])
def test_a_float32_fit_agrees_with_the_float64_fit(dim, kind, separation):
    """Soft responsibilities (components 2 spreads apart) and data 2e3 spreads across."""
    p = offset_problem(0.0, 1.0, dim, separation=separation, per=200, seed=4)
    narrow, own, float64 = _em(p, kind, "float32")
    wide = _em(p, kind, "float64")[0]
    where = f"D={dim} {kind} separation={separation}"
    assert max(_largest_differences(narrow, wide)) <= AGREE, where
    # the E-step's own objective is the float64 one of the same model, to float32's rounding
    extent = np.max(np.ptp(p.x, axis=0) / p.scales)
    assert np.max(np.abs(own - float64)) / len(p.x) <= OBJECTIVE + OBJECTIVE_PER_EXTENT * extent, where


@pytest.mark.parametrize("kind", KINDS)
def test_a_float32_fit_does_not_depend_on_the_offset(kind):
    at_zero = _em(offset_problem(0.0, 1.0, 3, separation=2.0, per=200, seed=4), kind, "float32")[0]
    for offset in (1e4, 1e6):
        moved = _em(offset_problem(offset, 1.0, 3, separation=2.0, per=200, seed=4), kind, "float32")[0]
        assert max(_largest_differences(moved, at_zero, offset)) <= AGREE, f"{kind} at {offset:g}"


@pytest.mark.parametrize("kind", KINDS)
def test_a_float32_fit_does_not_depend_on_the_units(kind):
    """Spreads 1e-3 and 1e3 (``reg_covar`` in the same units) against spread 1."""
    in_units = _em(offset_problem(0.0, 1.0, 3, separation=2.0, per=200, seed=4), kind, "float32")[0]
    for unit in (1e-3, 1e3):
        p = offset_problem(0.0, unit, 3, separation=2.0, per=200, seed=4)
        scaled = _em(p, kind, "float32", reg_covar=1e-6 * unit**2)[0]
        assert max(_largest_differences(scaled, in_units, unit=unit)) <= AGREE, f"{kind} in units of {unit:g}"


@pytest.mark.parametrize("dim, kind", [(1, "full"), *((3, kind) for kind in KINDS)])
def test_float32_em_never_goes_downhill_in_the_float64_objective(dim, kind):
    """At an offset of 1e6, soft responsibilities, from a start half a spread off."""
    p = offset_problem(1e6, 1.0, dim, separation=2.0, per=200, seed=7)
    _, _, float64 = _em(p, kind, "float32", steps=40)
    assert np.max(-np.diff(float64)) / len(p.x) <= DOWNHILL, f"D={dim} {kind}"


@pytest.mark.parametrize("kind", ["full", "diag"])
def test_the_float32_shared_frame_and_per_component_differences_agree(kind, monkeypatch):
    from mixle_nb.stats import frame

    p = offset_problem(1e6, 1.0, 3, separation=2.0, per=200, seed=4)
    shared = _em(p, kind, "float32")[0]
    monkeypatch.setattr(frame, "FLOAT32_SHARED_FRAME_REACH", -1.0)  # no model within reach
    _, start = estimator_and_start(p, kind, 1e-6)
    apart = _em(p, kind, "float32", model=MixtureDistribution(start.components, start.w))[0]
    assert max(_largest_differences(shared, apart)) <= AGREE


@pytest.mark.filterwarnings("ignore:Best performing initialization did not converge")  # 30 iterations, tol=0
def test_gaussian_mixture_takes_float32_from_its_input_as_scikit_learn_does():
    rng = np.random.default_rng(0)
    x = np.concatenate([rng.normal(-3, 1, (300, 2)), rng.normal(3, 1, (300, 2))]) + 1e4
    x = x.astype(np.float32).astype(np.float64)  # the same data in both dtypes
    start = dict(weights_init=[0.5, 0.5], means_init=[[1e4 - 2, 1e4 - 2], [1e4 + 2, 1e4 + 2]], tol=0, max_iter=30)
    wide = GaussianMixture(2, **start).fit(x)
    narrow = GaussianMixture(2, **start).fit(x.astype(np.float32))
    chosen = GaussianMixture(2, dtype="float32", **start).fit(x)
    for name in ("weights_", "means_", "covariances_", "precisions_", "precisions_cholesky_"):
        assert getattr(narrow, name).dtype == np.float32 and getattr(chosen, name).dtype == np.float64, name
    assert narrow.score_samples(x.astype(np.float32)).dtype == np.float32
    assert narrow.predict_proba(x.astype(np.float32)).dtype == np.float32
    for fit in (narrow, chosen):
        np.testing.assert_allclose(fit.weights_, wide.weights_, rtol=0, atol=AGREE)
        np.testing.assert_allclose(fit.means_, wide.means_, rtol=0, atol=1e4 * 2**-24 + AGREE)  # float32 rounding
        np.testing.assert_allclose(fit.covariances_, wide.covariances_, rtol=0, atol=AGREE)
        assert abs(fit.lower_bound_ - wide.lower_bound_) <= OBJECTIVE
    # the k-means start on a float32 encoding finds the same two groups
    labels = GaussianMixture(2, random_state=0).fit(x.astype(np.float32)).predict(x)
    assert len(set(labels[:300])) == len(set(labels[300:])) == 1 and labels[0] != labels[-1]


def _groups(offset: float, centres=(-3.0, 3.0), per: int = 300, dim: int = 3, seed: int = 0) -> np.ndarray:
    """Unit-spread groups at ``centres`` (on the diagonal) about ``offset``, in numbers float32 holds exactly."""
    rng = np.random.default_rng(seed)
    x = np.concatenate([rng.normal(c, 1, (per, dim)) for c in centres]) + offset
    return x.astype(np.float32).astype(np.float64)


def _covariances_by_component(fit, kind: str) -> np.ndarray:
    """``covariances_`` as one row per component (the tied one repeated)."""
    k = len(fit.weights_)
    covariances = np.asarray(fit.covariances_, dtype=np.float64)
    return np.broadcast_to(
        covariances.reshape(1 if kind == "tied" else k, -1), (k, covariances.size // (1 if kind == "tied" else k))
    )


@pytest.mark.filterwarnings("ignore:Best performing initialization did not converge")  # 100 iterations, tol=0
@pytest.mark.parametrize("kind", KINDS)
def test_a_float32_bayesian_fit_agrees_with_the_float64_fit(kind):
    """Three groups and three components at an offset of 1e4, 100 iterations from the same start
    (more components than groups would split a group, a ridge along which any rounding moves the fit)."""
    x = _groups(1e4, centres=(-4.0, 0.0, 4.0), per=200)
    for prior in PRIOR_TYPES:
        settings = dict(
            n_components=3,
            covariance_type=kind,
            weight_concentration_prior_type=prior,
            random_state=0,
            max_iter=100,
            tol=0,
        )
        wide = BayesianGaussianMixture(**settings).fit(x)
        narrow = BayesianGaussianMixture(dtype="float32", **settings).fit(x)
        where = f"{kind} {prior}"
        assert np.abs(narrow.weights_ - wide.weights_).max() <= BAYESIAN_AGREE, where
        assert np.abs(narrow.means_ - wide.means_).max() <= BAYESIAN_AGREE, where
        covariances = _covariances_by_component(narrow, kind), _covariances_by_component(wide, kind)
        assert np.abs(covariances[0] - covariances[1]).max() <= BAYESIAN_AGREE, where
        assert abs(narrow.lower_bound_ - wide.lower_bound_) / len(x) <= BOUND_NOISE, where
        assert np.max(-np.diff(narrow.lower_bounds_)) / len(x) <= BOUND_NOISE, where


@pytest.mark.filterwarnings("ignore:Best performing initialization did not converge")
@pytest.mark.parametrize("kind", KINDS)
def test_bayesian_mixture_takes_float32_from_its_input_as_scikit_learn_does(kind):
    from sklearn.mixture import BayesianGaussianMixture as ScikitBayesianGaussianMixture

    x = _groups(0.0, per=100, dim=2)
    narrow_x = x.astype(np.float32)
    settings = dict(n_components=3, covariance_type=kind, random_state=0, max_iter=20, tol=0)
    narrow = BayesianGaussianMixture(**settings).fit(narrow_x)
    theirs = ScikitBayesianGaussianMixture(**settings).fit(narrow_x)
    for name in ("weights_", "means_", "covariances_", "precisions_", "precisions_cholesky_", "mean_precision_"):
        assert getattr(narrow, name).dtype == getattr(theirs, name).dtype, name
    for name in ("mean_prior_", "covariance_prior_"):  # taken from the data: float32 where scikit-learn's are
        assert np.asarray(getattr(narrow, name)).dtype == np.asarray(getattr(theirs, name)).dtype, name
    assert narrow.score_samples(narrow_x).dtype == theirs.score_samples(narrow_x).dtype
    assert narrow.predict_proba(narrow_x).dtype == theirs.predict_proba(narrow_x).dtype
    # the input's float32 chose the float32 E-step; dtype= overrides it either way
    priors = dict(mean_prior=narrow.mean_prior_, covariance_prior=narrow.covariance_prior_)
    chosen = BayesianGaussianMixture(dtype="float32", **priors, **settings).fit(x)
    wide = BayesianGaussianMixture(**priors, **settings).fit(x)
    overridden = BayesianGaussianMixture(dtype="float64", **priors, **settings).fit(narrow_x)
    for name in ("weights_", "means_", "covariances_", "lower_bound_"):
        np.testing.assert_array_equal(getattr(narrow, name), getattr(chosen, name), err_msg=name)
        np.testing.assert_array_equal(getattr(overridden, name), getattr(wide, name), err_msg=name)
    assert np.abs(narrow.weights_ - wide.weights_).max() <= AGREE


@pytest.mark.parametrize("estimator", [GaussianMixture, BayesianGaussianMixture])
def test_partial_fit_takes_float32_from_its_input_as_fit_does(estimator):
    """Six chunks at an offset of 1e4: float32 chunks are folded exactly as ``dtype="float32"``
    folds their float64 values, and ``dtype="float64"`` folds float32 chunks as float64 ones."""
    x = _groups(1e4, per=300, dim=2)
    np.random.default_rng(1).shuffle(x)
    start = (
        dict(means_init=[[1e4 - 2, 1e4 - 2], [1e4 + 2, 1e4 + 2]])
        if estimator is GaussianMixture
        else dict(mean_prior=[1e4, 1e4], covariance_prior=9.0 * np.eye(2))
    )

    def folded(dtype, chunk_dtype):
        fit = estimator(n_components=2, random_state=0, dtype=dtype, **start)
        for chunk in np.array_split(x, 6):
            fit.partial_fit(chunk.astype(chunk_dtype))
        return fit

    wide, narrow = folded(None, np.float64), folded(None, np.float32)
    chosen, overridden = folded("float32", np.float64), folded("float64", np.float32)
    # the attributes' dtype is the chunks' as fit's is: float32 for GaussianMixture, float64 for the Bayesian
    attribute_dtype = np.float32 if estimator is GaussianMixture else np.float64
    assert narrow.means_.dtype == overridden.means_.dtype == attribute_dtype
    assert wide.means_.dtype == chosen.means_.dtype == np.float64
    for name in ("weights_", "means_", "covariances_"):
        np.testing.assert_array_equal(getattr(narrow, name), getattr(chosen, name).astype(attribute_dtype), name)
        np.testing.assert_array_equal(getattr(overridden, name), getattr(wide, name).astype(attribute_dtype), name)
    assert narrow.lower_bounds_ == chosen.lower_bounds_ and overridden.lower_bounds_ == wide.lower_bounds_
    np.testing.assert_allclose(chosen.weights_, wide.weights_, rtol=0, atol=AGREE)
    np.testing.assert_allclose(chosen.means_, wide.means_, rtol=0, atol=AGREE)
    np.testing.assert_allclose(chosen.covariances_, wide.covariances_, rtol=0, atol=AGREE)
