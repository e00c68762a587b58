"""scikit-learn's ``sklearn.mixture`` face on our EM core (mirrors its layout, as dask-ml and
cuML do). scikit-learn is a dependency of this subpackage only: ``pip install 'mixle_nb[sklearn]'``."""

from .bayesian_mixture import BayesianGaussianMixture
from .gaussian_mixture import GaussianMixture

__all__ = ["GaussianMixture", "BayesianGaussianMixture"]
