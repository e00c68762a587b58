"""Model choice: the information criteria (:func:`bic`, :func:`aic`) and choosing the number
of components (:func:`choose_k`, its answer a :class:`KChoice`)."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..stats.base import Distribution, Estimator
from ..stats.estimation import is_handle, seq_encode, seq_log_density_sum
from ..stats.hmm import HiddenMarkovDistribution, SequenceEncoding
from ..stats.parameters import free_parameters
from ..validation import integer, positive_int
from .fitting import ROOT_STDOUT, FitResult, _output, _say, fit


def _count_and_log_density(data_or_handle: Any, model: Distribution) -> tuple[float, float]:
    """BIC's ``N`` and the log-density: the observations, or for an HMM (whose observations
    are sequences) the samples in them, as hmmlearn counts."""
    enc = data_or_handle if is_handle(data_or_handle) else seq_encode(data_or_handle, model=model)
    count, total = seq_log_density_sum(enc, model)
    if isinstance(model, HiddenMarkovDistribution):
        count = _samples(enc, model)
    return count, total


def _samples(enc: Any, model: HiddenMarkovDistribution) -> float:
    """The samples in sequences: counted in a local encoding; on a handle, the states'
    occupancies after one E-step, which sum to them (one forward–backward pass and its fold)."""
    if isinstance(enc, SequenceEncoding):
        return float(enc.observations)
    _, (_, _, occupancy, _) = enc.pysp_stream_accumulate(model.estimator(), model)
    return float(np.sum(occupancy))


def bic(
    data_or_handle: Any, model: Distribution, estimator: Estimator | None = None, *, n_parameters: int | None = None
) -> float:
    """Bayesian information criterion ``-2 log L + p log N`` (lower is better).

    ``N`` counts observations; for a hidden Markov model, the samples in its sequences
    (hmmlearn's count), not the sequences.

    ``p`` counts the free parameters as ``estimator`` fits ``model``. On a handle: one
    log-density all-reduce.

    Parameters
    ----------
    data_or_handle : array_like or EncodedDataHandle
        Raw observations or any handle.
    model : Distribution
        The fitted model.
    estimator : Estimator, optional
        The estimator ``model`` was fitted with, so that tying (``keys``, ``variance_key``,
        ``covariance_key``) is counted (default ``model.estimator()``: nothing tied).
    n_parameters : int, optional
        The free parameters, for a family this package cannot count (mixle's).

    Returns
    -------
    float
        The criterion.

    Raises
    ------
    TypeError
        The free parameters of the family cannot be counted and ``n_parameters`` is not given.
    ValueError
        A negative ``n_parameters``.

    See Also
    --------
    aic, choose_k

    Examples
    --------
    >>> import numpy as np
    >>> from mixle_nb.inference import bic
    >>> from mixle_nb.stats import GaussianDistribution
    >>> x = np.array([-1.0, 0.0, 1.0])
    >>> model = GaussianDistribution(0.0, 1.0)
    >>> loglik = -1.5 * np.log(2 * np.pi) - 1.0
    >>> bool(np.isclose(bic(x, model), -2 * loglik + 2 * np.log(3)))
    True
    """
    p = _parameters(model, estimator, n_parameters)
    count, total = _count_and_log_density(data_or_handle, model)
    return -2.0 * total + p * math.log(count)


def aic(
    data_or_handle: Any, model: Distribution, estimator: Estimator | None = None, *, n_parameters: int | None = None
) -> float:
    """Akaike information criterion ``-2 log L + 2p`` (lower is better).

    Parameters
    ----------
    data_or_handle : array_like or EncodedDataHandle
        Raw observations or any handle.
    model : Distribution
        The fitted model.
    estimator : Estimator, optional
        The estimator ``model`` was fitted with, so that tying is counted (see :func:`bic`).
    n_parameters : int, optional
        The free parameters, for a family this package cannot count (mixle's).

    Returns
    -------
    float
        The criterion.

    Raises
    ------
    TypeError
        The free parameters of the family cannot be counted and ``n_parameters`` is not given.
    ValueError
        A negative ``n_parameters``.

    See Also
    --------
    bic, choose_k

    Examples
    --------
    >>> import numpy as np
    >>> from mixle_nb.inference import aic
    >>> from mixle_nb.stats import GaussianDistribution
    >>> x = np.array([-1.0, 0.0, 1.0])
    >>> loglik = -1.5 * np.log(2 * np.pi) - 1.0
    >>> bool(np.isclose(aic(x, GaussianDistribution(0.0, 1.0)), -2 * loglik + 2 * 2))
    True
    """
    p = _parameters(model, estimator, n_parameters)
    return -2.0 * _count_and_log_density(data_or_handle, model)[1] + 2.0 * p


def _parameters(model: Distribution, estimator: Estimator | None, n_parameters: int | None) -> int:
    if n_parameters is not None:
        return integer("n_parameters", n_parameters, minimum=0)
    return free_parameters(estimator if estimator is not None else model.estimator(), model)


@dataclass
class KChoice:
    """:func:`choose_k`'s answer: per K tried, the fitted result and its BIC and AIC.

    ``best_k`` minimises BIC.

    Parameters
    ----------
    k : list of int
        The K tried, in order.
    results : list of FitResult
        The fit of each K.
    bic, aic : list of float
        Each fit's BIC and AIC.

    Examples
    --------
    >>> from mixle_nb.inference import KChoice
    >>> choice = KChoice(k=[1, 2, 3], results=[], bic=[2055.1, 1702.5, 1720.7], aic=[2047.1, 1682.5, 1688.7])
    >>> choice.best_k, choice.best_index
    (2, 1)
    """

    k: list
    results: list
    bic: list
    aic: list

    @property
    def best_index(self) -> int:
        """The position of the lowest BIC (the first, on a tie): where ``best_k`` is."""
        return int(np.argmin(self.bic))

    @property
    def best_k(self) -> int:
        """The K of the lowest BIC (the first, on a tie)."""
        return self.k[self.best_index]

    @property
    def best_model(self) -> Distribution:
        """The fitted model of :attr:`best_k`."""
        return self.results[self.best_index].model


def choose_k(
    data_or_handle: Any,
    estimator_for: Callable[[int], Estimator],
    k_values: Iterable[int],
    *,
    on_fit: Callable[[int, FitResult, float, float], None] | None = None,
    n_parameters: Callable[[Distribution], int] | None = None,
    **fit_kwargs: Any,
) -> KChoice:
    """Fit a mixture for every K in ``k_values`` and score each with BIC and AIC.

    Local data is encoded once per K; a handle is used as it is. The tolerance defaults to
    scikit-learn's ``tol=1e-3`` unless ``tol`` or ``delta`` is given: run to a tighter
    tolerance, a spare component can keep shrinking onto one or two observations (the
    likelihood grows without bound as its variance falls to the floor), which buys it a BIC
    it does not deserve.

    Parameters
    ----------
    data_or_handle : array-like or EncodedDataHandle
        Raw observations or any handle.
    estimator_for : callable
        ``estimator_for(K)`` builds the estimator of K components (ours or mixle's;
        ``mixle_nb.stats.mixture.mixture_of_copies`` builds K copies of one component).
    k_values : iterable of int
        The K to try.
    on_fit : callable, optional
        ``on_fit(k, result, bic, aic)``, called after each K (for a live plot).
    n_parameters : callable, optional
        ``n_parameters(model)``: the free parameters of a fitted model, for a family this
        package cannot count (mixle's); by default :func:`bic` counts them.
    **fit_kwargs
        Passed to :func:`fit` (``init``, ``n_init``, ``rng``, ``out``, ``tol``, ...).

    Returns
    -------
    KChoice
        Per K, the fit and its BIC and AIC; ``best_k`` minimises BIC.

    Raises
    ------
    ValueError
        If a K is not a positive integer, or :func:`fit` refuses its arguments.
    TypeError
        If the free parameters of a family cannot be counted and ``n_parameters`` is not given.

    See Also
    --------
    bic, aic, fit

    Examples
    --------
    >>> import numpy as np
    >>> from mixle_nb.inference import choose_k
    >>> from mixle_nb.stats import GaussianEstimator, MixtureEstimator
    >>> rng = np.random.default_rng(0)
    >>> x = np.concatenate([rng.normal(-3, 1, 200), rng.normal(3, 1, 200)])
    >>> choice = choose_k(
    ...     x, lambda k: MixtureEstimator([GaussianEstimator()] * k), range(1, 4), rng=0, out=None
    ... )
    >>> choice.k, choice.best_k
    ([1, 2, 3], 2)
    """
    if "tol" not in fit_kwargs and "delta" not in fit_kwargs:
        fit_kwargs["tol"] = 1e-3
    out = fit_kwargs["out"] = _output(fit_kwargs.get("out", ROOT_STDOUT), data_or_handle)
    choice_ = KChoice([], [], [], [])
    for k in k_values:
        k = positive_int("K", k)
        estimator = estimator_for(k)
        _say(out, f"K = {k}")
        if is_handle(data_or_handle):
            result = fit(None, estimator, enc_data=data_or_handle, **fit_kwargs)
        else:
            result = fit(data_or_handle, estimator, **fit_kwargs)
        count = None if n_parameters is None else n_parameters(result.model)
        scores = (
            bic(data_or_handle, result.model, estimator, n_parameters=count),
            aic(data_or_handle, result.model, estimator, n_parameters=count),
        )
        for target, value in zip((choice_.k, choice_.results, choice_.bic, choice_.aic), (k, result, *scores)):
            target.append(value)
        if on_fit is not None:
            on_fit(k, result, *scores)
    return choice_
