"""Where EM starts: :func:`initial_model` (k-means‖, observations as centres, or random
responsibilities) and :func:`default_init`, the start a family gets by default."""

from __future__ import annotations

import warnings
from typing import Any

from ..stats.base import Distribution, Estimator
from ..stats.diagonal_gaussian import DiagonalGaussianEstimator
from ..stats.estimation import encoded_count, is_handle, seq_initialize
from ..stats.frame import PointEncoding
from ..stats.kmeans import SingleProcess, kmeans_init
from ..stats.mixture import MixtureEstimator, is_mixture_estimator
from ..stats.multivariate_gaussian import MultivariateGaussianEstimator
from ..stats.spherical_gaussian import SphericalGaussianEstimator
from ..validation import choice

#: The names of EM's starts: k-means++ (run as k-means‖ where the data live), K observations
#: as centres, or random responsibilities (see :func:`initial_model`).
INITS = ("kmeans++", "random_from_data", "random")
#: The component estimators whose mixtures start from k-means++ by default (:func:`default_init`).
GAUSSIAN_FAMILY = (DiagonalGaussianEstimator, SphericalGaussianEstimator, MultivariateGaussianEstimator)


def default_init(estimator: Estimator) -> str:
    """The start a family gets by default.

    Parameters
    ----------
    estimator : Estimator
        The family to fit.

    Returns
    -------
    str
        ``"kmeans++"`` for a mixture of Gaussian-family components, else ``"random"``.

    Examples
    --------
    >>> from mixle_nb.inference import default_init
    >>> from mixle_nb.stats import GaussianEstimator, MixtureEstimator, PoissonEstimator
    >>> default_init(MixtureEstimator([GaussianEstimator()] * 2))
    'kmeans++'
    >>> default_init(MixtureEstimator([PoissonEstimator()] * 2))
    'random'
    """
    if isinstance(estimator, MixtureEstimator) and all(isinstance(e, GAUSSIAN_FAMILY) for e in estimator.estimators):
        return "kmeans++"
    return "random"


def initial_model(
    enc: Any, estimator: Estimator, init: str | Distribution, rng: Any = None, init_p: float = 0.1
) -> Distribution:
    """The start of EM on local encoded data or a handle.

    A handle without the ``pysp_kmeans_init`` extension falls back to ``"random"`` with a warning.

    Parameters
    ----------
    enc : encoding or EncodedDataHandle
        Local encoded data or any handle.
    estimator : Estimator
        The family to start.
    init : str or Distribution
        ``"kmeans++"`` (k-means‖ where the data live, a few Lloyd iterations, then the
        mixture estimated from hard labels), ``"random_from_data"`` (K observations as
        centres, then the same), ``"random"`` (``seq_initialize`` with fraction ``init_p``),
        or a model, returned as it is.
    rng : None, int, numpy.random.Generator or numpy.random.RandomState
        The random source.
    init_p : float, default 0.1
        The fraction of observations a ``"random"`` start draws.

    Returns
    -------
    Distribution
        The start model.

    Raises
    ------
    ValueError
        If ``init`` is not a start name or a model, or a mixture has more components than
        there are observations.

    See Also
    --------
    default_init, fit

    Examples
    --------
    >>> import numpy as np
    >>> from mixle_nb.inference import initial_model
    >>> from mixle_nb.stats import GaussianEstimator, MixtureEstimator, seq_encode
    >>> rng = np.random.default_rng(0)
    >>> x = np.concatenate([rng.normal(-3, 1, 200), rng.normal(3, 1, 200)])
    >>> estimator = MixtureEstimator([GaussianEstimator()] * 2)
    >>> start = initial_model(seq_encode(x, estimator=estimator), estimator, "kmeans++", rng=0)
    >>> sorted(round(c.mu) for c in start.components)
    [-3, 3]
    """
    _require_enough_observations(enc, estimator)
    if not isinstance(init, str):
        return init
    name: str = choice("init", init, INITS)
    if name == "random":
        return seq_initialize(enc, estimator, rng, init_p)
    if hasattr(enc, "pysp_kmeans_init"):
        return enc.pysp_kmeans_init(estimator, rng, name)
    if is_handle(enc):  # a handle without the extension
        warnings.warn(
            f"{type(enc).__name__} has no pysp_kmeans_init; init={name!r} falls back to 'random'", stacklevel=3
        )
        return seq_initialize(enc, estimator, rng, init_p)
    return kmeans_init([enc], estimator, rng, SingleProcess(), name)


def _require_enough_observations(enc: Any, estimator: Estimator) -> None:
    """Refuse, before any work, a mixture of more components than observations (scikit-learn
    does too): EM would leave components with no data, looking fitted. On a handle the count
    is the global one every rank knows, so every rank raises together, with no collective."""
    mixture: object = estimator
    if not is_mixture_estimator(mixture):
        return
    components = mixture.estimators
    try:
        n = len(enc) if is_handle(enc) or isinstance(enc, PointEncoding) else encoded_count(enc, estimator)
    except TypeError:  # a handle or an encoding that cannot count its observations
        return
    if n < len(components):
        raise ValueError(
            f"a mixture of {len(components)} components needs at least {len(components)} "
            f"observations, and the data hold {n}: use at most {n} components (e.g. "
            f"choose_k(data, ..., range(1, {n + 1}))), or fit more data"
        )
