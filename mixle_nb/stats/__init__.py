"""The EM core: distribution families in the pysp protocol, and the ``seq_*`` dispatch."""

from .base import Accumulator, Distribution, Encoder, Estimator
from .categorical import CategoricalDistribution, CategoricalEstimator
from .centred_moments import DegenerateComponentError
from .diagonal_gaussian import DiagonalGaussianDistribution, DiagonalGaussianEstimator
from .estimation import (
    EMStep,
    accumulate,
    em_step,
    m_step,
    seq_encode,
    seq_estimate,
    seq_initialize,
    seq_log_density_sum,
    tie_keys,
)
from .gaussian import GaussianDistribution, GaussianEstimator
from .mixture import MixtureDistribution, MixtureEstimator
from .multivariate_gaussian import MultivariateGaussianDistribution, MultivariateGaussianEstimator
from .parameters import free_parameters
from .poisson import PoissonDistribution, PoissonEstimator
from .spherical_gaussian import SphericalGaussianDistribution, SphericalGaussianEstimator

__all__ = [
    "Accumulator",
    "Distribution",
    "Encoder",
    "Estimator",
    "EMStep",
    "CategoricalDistribution",
    "CategoricalEstimator",
    "DegenerateComponentError",
    "DiagonalGaussianDistribution",
    "DiagonalGaussianEstimator",
    "GaussianDistribution",
    "GaussianEstimator",
    "MixtureDistribution",
    "MixtureEstimator",
    "MultivariateGaussianDistribution",
    "MultivariateGaussianEstimator",
    "PoissonDistribution",
    "PoissonEstimator",
    "SphericalGaussianDistribution",
    "SphericalGaussianEstimator",
    "accumulate",
    "em_step",
    "free_parameters",
    "m_step",
    "seq_encode",
    "seq_estimate",
    "seq_initialize",
    "seq_log_density_sum",
    "tie_keys",
]
