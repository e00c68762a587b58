"""The Gaussian M-step of all K components at once (``stacked_estimate``) is the per-component
M-step, bit for bit, on data far from the origin; a degenerate component still gets its own
error, naming it."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from offset_data import offset_problem

from mixle_nb.stats import (
    DiagonalGaussianEstimator,
    MixtureEstimator,
    MultivariateGaussianEstimator,
    SphericalGaussianEstimator,
    seq_encode,
)
from mixle_nb.stats.centred_moments import DegenerateComponentError
from mixle_nb.stats.estimation import accumulate

FAMILIES = {
    "full": MultivariateGaussianEstimator,
    "diag": DiagonalGaussianEstimator,
    "spherical": SphericalGaussianEstimator,
}


def _statistics(kind: str, offset: float) -> tuple[MixtureEstimator, tuple]:
    """An E-step's statistics of 3 components on 3-D data at ``offset``, hard labels."""
    problem = offset_problem(offset, "mixed", 3)
    estimator = MixtureEstimator([FAMILIES[kind](dim=3, reg_covar=1e-9) for _ in range(problem.k)])
    enc = seq_encode(problem.x, estimator=estimator)
    model = estimator.estimate(None, _labelled(estimator, enc, problem.labels, problem.start_means))
    acc = accumulate([enc], estimator, model).accumulator
    return estimator, acc.value()


def _labelled(estimator: MixtureEstimator, enc: object, labels: np.ndarray, references: np.ndarray) -> tuple:
    acc = estimator.accumulator_factory().make()
    resp = torch.from_numpy(np.eye(len(references))[labels].T.copy())
    acc.seq_update_responsibilities(enc, resp, references=references)
    return acc.value()


@pytest.mark.parametrize("kind", sorted(FAMILIES))
@pytest.mark.parametrize("offset", [0.0, 1e8])
def test_stacked_estimate_is_the_per_component_estimate(kind: str, offset: float) -> None:
    estimator, (counts, values) = _statistics(kind, offset)
    family = type(estimator.estimators[0])
    stacked = family.stacked_estimate(estimator.estimators, values)
    assert stacked is not None
    alone = [e.estimate(c, v) for e, c, v in zip(estimator.estimators, counts, values)]
    for together, single in zip(stacked, alone):
        assert type(together) is type(single)
        np.testing.assert_array_equal(together.mu, single.mu)  # bit for bit: the same arithmetic
        if kind == "full":
            np.testing.assert_array_equal(together.covar, single.covar)
            np.testing.assert_array_equal(together._prec_chol, single._prec_chol)
            assert together._log_norm == single._log_norm
        else:
            np.testing.assert_array_equal(together.sigma2, single.sigma2)
    assert estimator.estimate(None, (counts, values)).components[0].mu.tolist() == alone[0].mu.tolist()


@pytest.mark.parametrize("kind", sorted(FAMILIES))
def test_degenerate_component_keeps_its_error(kind: str) -> None:
    estimator, (counts, values) = _statistics(kind, 1e8)
    values = [np.array(v) for v in values]
    values[1][:] = 0.0  # no weight
    assert type(estimator.estimators[0]).stacked_estimate(estimator.estimators, values) is None
    with pytest.raises(DegenerateComponentError, match=r"component 1 of 3 received no weight in the M-step"):
        estimator.estimate(None, (counts, values))


@pytest.mark.parametrize("dim", [3, 12, 40])
def test_precision_factors_of_one_and_of_a_batch_agree_to_the_bit(dim: int) -> None:
    """``kernel_constants`` takes the same arithmetic for one Cholesky factor and for a batch
    (numpy's inverse up to D = 8, LAPACK's triangular inverse above), so a component's own
    M-step and the stacked one give the same precision factor; ``U Uᵀ`` is the precision within
    1e-12 relative, and above D = 8 ``U`` is exactly upper triangular."""
    from mixle_nb.stats.multivariate_gaussian import TRIANGULAR_INVERSE_DIM, kernel_constants

    rng = np.random.default_rng(dim)
    spread = rng.normal(size=(4, 2 * dim, dim))
    covariances = np.einsum("kni,knj->kij", spread, spread) / (2 * dim) + 1e-3 * np.eye(dim)
    chol = np.linalg.cholesky(covariances)
    factors, log_norms = kernel_constants(chol)
    for k in range(len(chol)):
        factor, log_norm = kernel_constants(chol[k])
        np.testing.assert_array_equal(factor, factors[k])
        assert log_norm == log_norms[k]
        precision = np.linalg.inv(covariances[k])
        np.testing.assert_allclose(factor @ factor.T, precision, rtol=0, atol=1e-12 * np.abs(precision).max())
        if dim > TRIANGULAR_INVERSE_DIM:
            assert (np.tril(factor, -1) == 0.0).all()
