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
