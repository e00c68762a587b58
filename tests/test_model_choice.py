"""BIC, AIC, free-parameter counts, responsibilities and the spherical Gaussian against
scikit-learn's GaussianMixture with the same parameters, and choosing K by BIC."""

from __future__ import annotations

import numpy as np
import pytest
from separated_mixtures import datasets
from sklearn.mixture import GaussianMixture

from mixle_nb.inference import aic, bic, choose_k, predict, predict_proba, score_samples
from mixle_nb.stats import (
    CategoricalDistribution,
    DiagonalGaussianDistribution,
    DiagonalGaussianEstimator,
    GaussianDistribution,
    GaussianEstimator,
    MixtureDistribution,
    MixtureEstimator,
    MultivariateGaussianDistribution,
    MultivariateGaussianEstimator,
    PoissonDistribution,
    PoissonEstimator,
    SphericalGaussianDistribution,
    SphericalGaussianEstimator,
    free_parameters,
    seq_encode,
    seq_estimate,
)

COVARIANCES = ["full", "diag", "tied", "spherical"]


def as_mixle(gm: GaussianMixture):
    """Our model and estimator with scikit-learn's fitted parameters and tying."""
    k, d = gm.means_.shape
    if gm.covariance_type == "full":
        comps = [MultivariateGaussianDistribution(m, c) for m, c in zip(gm.means_, gm.covariances_)]
        ests = [MultivariateGaussianEstimator(d) for _ in range(k)]
    elif gm.covariance_type == "tied":
        comps = [MultivariateGaussianDistribution(m, gm.covariances_) for m in gm.means_]
        ests = [MultivariateGaussianEstimator(d, covariance_key="tied") for _ in range(k)]
    elif gm.covariance_type == "diag":
        comps = [DiagonalGaussianDistribution(m, v) for m, v in zip(gm.means_, gm.covariances_)]
        ests = [DiagonalGaussianEstimator(d) for _ in range(k)]
    else:
        comps = [SphericalGaussianDistribution(m, v) for m, v in zip(gm.means_, gm.covariances_)]
        ests = [SphericalGaussianEstimator(d) for _ in range(k)]
    return MixtureDistribution(comps, gm.weights_ / gm.weights_.sum()), MixtureEstimator(ests)


@pytest.fixture(scope="module")
def fitted():
    """scikit-learn fits of every covariance type on a 3-D, 5-component dataset."""
    x = next(d for d in datasets() if d.dim == 3).x
    return x, {cov: GaussianMixture(5, covariance_type=cov, random_state=0).fit(x) for cov in COVARIANCES}


@pytest.mark.parametrize("covariance", COVARIANCES)
def test_bic_and_aic_equal_sklearn(fitted, covariance):
    x, fits = fitted
    gm = fits[covariance]
    model, estimator = as_mixle(gm)
    assert bic(x, model, estimator) == pytest.approx(gm.bic(x), rel=1e-8)
    assert aic(x, model, estimator) == pytest.approx(gm.aic(x), rel=1e-8)
    assert free_parameters(estimator, model) == gm._n_parameters()


@pytest.mark.parametrize("covariance", COVARIANCES)
def test_predict_proba_equals_sklearn(fitted, covariance):
    x, fits = fitted
    gm = fits[covariance]
    model, _ = as_mixle(gm)
    np.testing.assert_allclose(predict_proba(x, model), gm.predict_proba(x), rtol=0, atol=1e-10)
    np.testing.assert_array_equal(predict(x, model), gm.predict(x))
    np.testing.assert_allclose(score_samples(x, model), gm.score_samples(x), rtol=1e-10, atol=0)


def test_one_dimensional_shared_variance_counts_as_sklearn_tied():
    x = datasets()[0].x
    gm = GaussianMixture(3, covariance_type="tied", random_state=0).fit(x[:, None])
    model = MixtureDistribution([GaussianDistribution(m[0], gm.covariances_[0, 0]) for m in gm.means_], gm.weights_)
    estimator = MixtureEstimator([GaussianEstimator(variance_key="v") for _ in range(3)])
    assert bic(x, model, estimator) == pytest.approx(gm.bic(x[:, None]), rel=1e-8)
    assert free_parameters(model.estimator(), model) == 3 * 2 + 2  # untied: a variance each


def test_free_parameters_of_other_families_and_tyings():
    categorical = MixtureDistribution(
        [
            CategoricalDistribution({"a": 0.5, "b": 0.3, "c": 0.2}),
            CategoricalDistribution({"a": 0.1, "b": 0.1, "c": 0.8}),
        ],
        [0.5, 0.5],
    )
    assert free_parameters(categorical.estimator(), categorical) == 1 + 2 * 2
    poisson = MixtureDistribution([PoissonDistribution(1.0), PoissonDistribution(5.0)], [0.3, 0.7])
    assert free_parameters(MixtureEstimator([PoissonEstimator(), PoissonEstimator()]), poisson) == 1 + 2
    gauss = MixtureDistribution([GaussianDistribution(0, 1), GaussianDistribution(0, 1)], [0.5, 0.5])
    tied_all = MixtureEstimator([GaussianEstimator(keys="g"), GaussianEstimator(keys="g")])
    assert free_parameters(tied_all, gauss) == 1 + 2
    spherical = MixtureDistribution([SphericalGaussianDistribution([0, 0], 1.0)] * 3, [0.2, 0.3, 0.5])
    shared = MixtureEstimator([SphericalGaussianEstimator(2, variance_key="s") for _ in range(3)])
    assert free_parameters(shared, spherical) == 2 + 3 * 2 + 1
    diag = MixtureDistribution([DiagonalGaussianDistribution([0, 0, 0], [1, 1, 1])] * 2, [0.5, 0.5])
    assert free_parameters(MixtureEstimator([DiagonalGaussianEstimator(3, variance_key="v")] * 2), diag) == 1 + 6 + 3
    # A mixture's keys tie its weights with another mixture's: counted once.
    pair = MixtureDistribution([gauss, gauss], [0.5, 0.5])
    inner = MixtureEstimator([GaussianEstimator(), GaussianEstimator()], keys="w")
    assert free_parameters(MixtureEstimator([inner, inner]), pair) == 1 + 1 + 2 * 4
    with pytest.raises(TypeError, match="pass n_parameters="):
        free_parameters(object(), categorical)  # a family this package does not know
    assert bic([0.5, 1.5], GaussianDistribution(1, 1), n_parameters=7) == pytest.approx(
        -2 * 2 * (-0.5 * np.log(2 * np.pi) - 0.125) + 7 * np.log(2), rel=1e-12
    )


def test_spherical_m_step_averages_the_coordinates_variances():
    rng = np.random.default_rng(3)
    x = np.concatenate([rng.normal(0, [1.0, 2.0], size=(300, 2)), rng.normal(6, [0.5, 1.5], size=(200, 2))])
    start = MixtureDistribution(
        [SphericalGaussianDistribution([0.5, 0.0], 1.0), SphericalGaussianDistribution([5.0, 5.0], 2.0)], [0.5, 0.5]
    )
    estimator = MixtureEstimator([SphericalGaussianEstimator(2, reg_covar=0.0)] * 2)  # the closed form adds nothing
    model = seq_estimate(seq_encode(x, model=start), estimator, start)
    resp = predict_proba(x, start)
    for k, comp in enumerate(model.components):
        n = resp[:, k].sum()
        mean = resp[:, k] @ x / n
        variance = (resp[:, k] @ ((x - mean) ** 2)).sum() / (n * 2)
        np.testing.assert_allclose(comp.mu, mean, rtol=1e-10)
        assert comp.variance == pytest.approx(variance, rel=1e-9)
    np.testing.assert_allclose(model.w, resp.mean(axis=0), rtol=1e-12)
    one = SphericalGaussianEstimator(reg_covar=0.0)
    acc = one.accumulator_factory().make()
    acc.seq_update(seq_encode(x[:300], model=start.components[0]), None, None)
    fitted_one = one.estimate(None, acc.value())
    assert fitted_one.variance == pytest.approx(x[:300].var(axis=0).mean(), rel=1e-9)


@pytest.mark.parametrize("index", range(len(datasets())))
def test_bic_picks_the_true_number_of_components(index):
    ds = datasets()[index]
    chosen = choose_k(ds.x, ds.estimator, range(1, ds.k + 3), rng=0, out=None)
    assert chosen.best_k == ds.k, f"{ds.name}: BIC per K {dict(zip(chosen.k, np.round(chosen.bic, 1)))}"
    assert chosen.best_index == chosen.k.index(ds.k) and chosen.best_model is chosen.results[chosen.best_index].model
    assert chosen.bic[chosen.k.index(ds.k)] == pytest.approx(bic(ds.x, chosen.best_model, ds.estimator()))
