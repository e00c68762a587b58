"""GaussianMixture's ``sample_weight`` (a row of integer weight w is w copies of it) and
``partial_fit`` (stepwise EM over chunks reaches the batch fit), against independent
references: the fit of the repeated rows, and the batch fit of all the rows."""

from __future__ import annotations

import re
import warnings

import numpy as np
import pytest
from sklearn.exceptions import ConvergenceWarning
from sklearn_ranks import TYPES, blobs, settings

from mixle_nb.mixture import GaussianMixture

RTOL = 1e-8
ATTRIBUTES = ("weights_", "means_", "covariances_", "precisions_cholesky_", "lower_bound_", "lower_bounds_")


def relative_difference(a, b) -> float:
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    assert a.shape == b.shape
    return float(np.max(np.abs(a - b) / np.maximum(np.abs(b), 1e-300)))


@pytest.mark.parametrize("covariance_type", TYPES)
def test_integer_weights_fit_as_the_rows_repeated(covariance_type):
    x = blobs(300, 3, 3)
    w = np.random.default_rng(1).integers(0, 4, size=len(x))
    kwargs = settings(covariance_type, x)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        weighted = GaussianMixture(**kwargs).fit(x, sample_weight=w)
        repeated = GaussianMixture(**kwargs).fit(np.repeat(x, w, axis=0))
    for name in ATTRIBUTES:
        assert relative_difference(getattr(weighted, name), getattr(repeated, name)) <= RTOL, name
    assert weighted.n_iter_ == repeated.n_iter_ == 12


@pytest.mark.parametrize("init_params", ["k-means++", "random"])
def test_starts_ignore_rows_of_weight_zero(init_params):
    # rows of weight 0 far away would draw a centre or move a mean if the start counted them
    x = blobs(200, 2, 2, seed=4)
    far = np.vstack([x, np.full((50, 2), 1e3)])
    w = np.r_[np.ones(len(x)), np.zeros(50)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        gm = GaussianMixture(2, init_params=init_params, random_state=0, max_iter=300).fit(far, sample_weight=w)
        reference = GaussianMixture(2, init_params=init_params, random_state=0, max_iter=300).fit(x)
    assert np.abs(gm.means_).max() < 10
    assert gm.score(x) == pytest.approx(reference.score(x), abs=1e-2)


@pytest.mark.parametrize(
    ("weights", "message"),
    [
        (np.ones(9), re.escape("sample_weight.shape == (9,), expected (10,)!")),
        (np.r_[np.ones(9), np.nan], "Input sample_weight contains NaN"),
        (np.r_[np.ones(7), -1.0, 1.0, 1.0], re.escape("Negative values in data passed to `sample_weight` (row 7")),
        (np.zeros(10), "Sample weights must contain at least one non-zero number"),
    ],
)
def test_bad_weights_get_scikit_learns_errors_before_any_work(weights, message):
    gm = GaussianMixture(2)
    with pytest.raises(ValueError, match=message):
        gm.fit(blobs(10, 2, 2), sample_weight=weights)
    assert not hasattr(gm, "means_")
    with pytest.raises(ValueError, match=message):
        gm.partial_fit(blobs(10, 2, 2), sample_weight=weights)


def test_partial_fit_passes_over_chunks_reach_the_batch_fit():
    # the size: 40 chunks x 3 passes of N = 2e5, D = 4, K = 5
    rng = np.random.default_rng(0)
    centres = rng.normal(size=(5, 4)) * 3
    x = centres[rng.integers(5, size=200_000)] + rng.normal(size=(200_000, 4))
    batch = GaussianMixture(5, random_state=0, tol=1e-6, max_iter=500).fit(x)
    online = GaussianMixture(5, random_state=0)
    for _ in range(3):
        for chunk in np.array_split(x, 40):
            online.partial_fit(chunk)
    assert online.n_iter_ == 120 and len(online.lower_bounds_) == 120 and not online.converged_
    assert abs(online.score(x) - batch.score(x)) < 1e-3


def test_partial_fit_with_weights_equals_the_rows_repeated_and_refuses_other_features():
    x = blobs(400, 2, 2, seed=2)
    w = np.random.default_rng(3).integers(1, 3, size=len(x))
    kwargs = settings("full", x, k=2)
    weighted, repeated = GaussianMixture(**kwargs), GaussianMixture(**kwargs)
    for part in np.array_split(np.arange(len(x)), 4):
        weighted.partial_fit(x[part], sample_weight=w[part])
        repeated.partial_fit(np.repeat(x[part], w[part], axis=0))
    for name in ATTRIBUTES:
        assert relative_difference(getattr(weighted, name), getattr(repeated, name)) <= RTOL, name
    with pytest.raises(ValueError, match="X has 3 features, but GaussianMixture is expecting 2 features as input"):
        weighted.partial_fit(blobs(10, 3, 2))
