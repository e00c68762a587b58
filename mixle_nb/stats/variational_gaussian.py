"""Variational Bayes for a Gaussian mixture (scikit-learn's ``BayesianGaussianMixture``) on
the EM core.

The E-step is the Gaussian mixture's: the same batched kernel over the same encoding, with
each component's *expected* log-joint in place of ``log w_k + log p_k(x)``. That is a
Gaussian log-density with the posterior mean ``m_k`` and the normalised Wishart scale
``W_k⁻¹/ν_k`` plus a per-component constant (the digamma terms of ``E[log π_k]`` and of
``E[log |Λ_k|]``, and ``-D/(2β_k)``), so :class:`VariationalGaussianMixture` is a
:class:`~.mixture.MixtureDistribution` whose log-weights are those constants, unnormalised.
The statistics are the same accumulators' (:mod:`.centred_moments`: responsibility-weighted
counts, sums and second moments about a reference point), plus one number, the
responsibilities' entropy ``-Σ r log r``, which the lower bound needs. It is taken from the
same sums: ``Σ_nk r_nk log r_nk = Σ_k Σ_n r_nk ℓ_nk - Σ_n log Σ_k e^{ℓ_nk}``, where the
first term is each component's count, constant and Mahalanobis sum ``tr(Λ_k M_k)``, and the
second the log-normaliser the E-step reports anyway; so it costs nothing per row and folds
across ranks as a sum. The M-step is the variational update (Bishop §10.2, in
scikit-learn's parametrisation), and :attr:`VariationalGaussianMixture.lower_bound` the
evidence lower bound after it, without scikit-learn's dropped constants, so the numbers are
scikit-learn's.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from scipy.linalg import solve_triangular
from scipy.special import betaln, digamma, gammaln

from .base import Accumulator, Distribution, Encoder, Estimator, total
from .centred_moments import _split
from .diagonal_gaussian import DiagonalGaussianDistribution, DiagonalGaussianEstimator
from .frame import LOG_2PI, encoding_dtype
from .mixture import MixtureAccumulator, MixtureDistribution, MixtureEstimator
from .multivariate_gaussian import MultivariateGaussianDistribution, MultivariateGaussianEstimator
from .spherical_gaussian import SphericalGaussianDistribution

COVARIANCE_TYPES = ("full", "tied", "diag", "spherical")
PRIOR_TYPES = ("dirichlet_process", "dirichlet_distribution")
ILL_DEFINED = (
    "Fitting the mixture model failed because some components have ill-defined empirical "
    "covariance (for instance caused by singleton or collapsed samples). Try to decrease the "
    "number of components, increase reg_covar, or scale the input data."
)
# scikit-learn adds this to every component's count, so an empty component has a mean
TINY_COUNT = 10 * np.finfo(np.float64).eps


def full_statistics(covariance_type: str, n_features: int) -> bool:
    """Whether the type's statistics are full second moments (else per-coordinate ones)."""
    return covariance_type in ("full", "tied") and n_features > 1


@dataclass(frozen=True)
class VariationalPriors:
    """The priors of the variational mixture, as scikit-learn's fitted ``*_prior_`` attributes.

    ``covariance`` has the shape of one component's ``covariances_`` entry for the type:
    (D, D) full and tied, (D,) diag, a float spherical."""

    covariance_type: str
    prior_type: str
    weight_concentration: float
    mean_precision: float
    mean: np.ndarray
    degrees_of_freedom: float
    covariance: Any
    reg_covar: float


class VariationalGaussianMixture(MixtureDistribution):
    """The variational posterior of a Gaussian mixture, in scikit-learn's parameters.

    As a :class:`~.mixture.MixtureDistribution` it is the E-step's expected log-joint:
    Gaussian components of mean ``means[k]`` and covariance ``covariances[k]`` (the
    normalised Wishart scale), with log-weights the expectations' constants (unnormalised;
    :meth:`log_joint` is scikit-learn's ``_estimate_weighted_log_prob``). ``lower_bound``
    is the evidence lower bound reached by the step that made it (``nan`` for a start)."""

    def __init__(
        self,
        priors: VariationalPriors,
        weight_concentration: Any,
        mean_precision: np.ndarray,
        means: np.ndarray,
        degrees_of_freedom: Any,
        covariances: Any,
        lower_bound: float = math.nan,
    ):
        self.priors = priors
        self.weight_concentration = weight_concentration
        self.mean_precision = np.asarray(mean_precision, dtype=np.float64)
        self.means = np.asarray(means, dtype=np.float64)
        self.degrees_of_freedom = degrees_of_freedom
        self.covariances = covariances
        self.precisions_cholesky = precisions_cholesky(priors.covariance_type, covariances)
        self.lower_bound = float(lower_bound)
        k, d = self.means.shape
        expected = expected_log_weights(priors.prior_type, weight_concentration)
        dof = np.broadcast_to(np.asarray(degrees_of_freedom, dtype=np.float64), (k,))
        log_lambda = d * math.log(2.0) + np.sum(digamma(0.5 * (dof - np.arange(d)[:, None])), axis=0)
        log_weights = expected + 0.5 * (log_lambda - d / self.mean_precision) - 0.5 * d * np.log(dof)
        super().__init__(gaussian_components(priors.covariance_type, self.means, covariances), np.full(k, 1.0 / k))
        self._log_w = log_weights

    def __repr__(self) -> str:
        concentration = np.asarray(self.weight_concentration).tolist()
        return (
            f"VariationalGaussianMixture({self.priors.covariance_type!r}, weight_concentration={concentration}, "
            f"mean_precision={self.mean_precision.tolist()}, means={self.means.tolist()}, "
            f"degrees_of_freedom={np.asarray(self.degrees_of_freedom).tolist()}, "
            f"covariances={np.asarray(self.covariances).tolist()}, lower_bound={self.lower_bound!r})"
        )

    def weights(self) -> np.ndarray:
        """scikit-learn's ``weights_``: the posterior mean of the mixture weights."""
        concentration = self.weight_concentration
        if self.priors.prior_type == "dirichlet_process":
            a, b = concentration
            total_ab = a + b
            weights = a / total_ab * np.hstack((1, np.cumprod(b[:-1] / total_ab[:-1])))
            return np.asarray(weights / np.sum(weights))
        return np.asarray(concentration / np.sum(concentration))

    def component_log_joint_sums(self, value: Sequence[np.ndarray], reference_values: Sequence[np.ndarray]) -> float:
        """``Σ_k Σ_n r_nk ℓ_nk``: the responsibility-weighted expected log-joint of the rows
        whose component sums are ``value`` (``[n, n·c, S1, S2]`` each, about ``c``), ``ℓ``
        this model's; ``reference_values`` gives each component's ``c``."""
        full = full_statistics(self.priors.covariance_type, self.means.shape[1])
        kind = self.priors.covariance_type
        summed = 0.0
        for k, (stats, reference) in enumerate(zip(value, reference_values)):
            n, _, s1, s2 = _split(np.asarray(stats, dtype=np.float64), full)
            if n == 0:
                continue
            offset = reference - self.means[k]
            chol = self.precisions_cholesky if kind == "tied" else self.precisions_cholesky[k]
            if full:
                moment = s2 + np.outer(s1, offset) + np.outer(offset, s1) + n * np.outer(offset, offset)
                mahalanobis = float(np.sum(chol * (moment @ chol)))
                log_det = float(np.sum(np.log(np.diag(chol))))
            else:
                moment = s2 + 2.0 * offset * s1 + n * offset * offset
                precision = np.broadcast_to(np.reshape(np.asarray(chol) ** 2, -1), moment.shape)
                mahalanobis = float(np.sum(moment * precision))
                log_det = float(np.sum(np.log(np.broadcast_to(np.reshape(chol, -1), moment.shape))))
            constant = self._log_w[k] - 0.5 * len(offset) * LOG_2PI + log_det
            summed += n * constant - 0.5 * mahalanobis
        return summed


def expected_log_weights(prior_type: str, concentration: Any) -> np.ndarray:
    """``E[log π_k]`` under the stick-breaking (Beta pairs) or Dirichlet posterior."""
    if prior_type == "dirichlet_process":
        a, b = concentration
        digamma_sum = digamma(a + b)
        return np.asarray(digamma(a) - digamma_sum + np.hstack((0, np.cumsum(digamma(b) - digamma_sum)[:-1])))
    return np.asarray(digamma(concentration) - digamma(np.sum(concentration)))


def gaussian_components(covariance_type: str, means: np.ndarray, covariances: Any) -> list[Distribution]:
    """The E-step kernel's Gaussians: mean ``means[k]``, covariance ``covariances[k]``."""
    k, d = means.shape
    covariances = np.asarray(covariances, dtype=np.float64)
    if covariance_type == "tied":
        covariances = np.broadcast_to(covariances, (k, d, d))
    if full_statistics(covariance_type, d):
        return [MultivariateGaussianDistribution(m, c) for m, c in zip(means, covariances)]
    if covariance_type == "spherical" and d > 1:
        return [SphericalGaussianDistribution(m, c) for m, c in zip(means, covariances)]
    variances = covariances if covariance_type == "diag" else covariances.reshape(k, 1)
    return [DiagonalGaussianDistribution(m, v) for m, v in zip(means, variances)]


def precisions_cholesky(covariance_type: str, covariances: Any) -> np.ndarray:
    """scikit-learn's ``precisions_cholesky_`` of ``covariances``; its error when one is not
    positive definite."""
    covariances = np.asarray(covariances, dtype=np.float64)
    if covariance_type in ("diag", "spherical"):
        if np.any(covariances <= 0.0):
            raise ValueError(ILL_DEFINED)
        return np.asarray(1.0 / np.sqrt(covariances))

    def one(covariance: np.ndarray) -> np.ndarray:
        try:
            lower = np.linalg.cholesky(covariance)
        except np.linalg.LinAlgError:
            raise ValueError(ILL_DEFINED) from None
        return np.asarray(solve_triangular(lower, np.eye(len(covariance)), lower=True).T)

    return one(covariances) if covariance_type == "tied" else np.stack([one(c) for c in covariances])


def log_det_cholesky(covariance_type: str, chol: np.ndarray, n_features: int) -> Any:
    """``log |U|`` per component (one number for tied) of precision Cholesky factors."""
    if covariance_type == "full":
        return np.sum(np.log(np.diagonal(chol, axis1=1, axis2=2)), axis=1)
    if covariance_type == "tied":
        return float(np.sum(np.log(np.diag(chol))))
    if covariance_type == "diag":
        return np.sum(np.log(chol), axis=1)
    return n_features * np.log(chol)


def log_wishart_norm(degrees_of_freedom: Any, log_det_chol: Any, n_features: int) -> Any:
    """The Wishart's log-normaliser without its ``log π`` term (as scikit-learn drops it)."""
    dof = np.asarray(degrees_of_freedom, dtype=np.float64)
    return -(
        dof * log_det_chol
        + dof * n_features * 0.5 * math.log(2.0)
        + np.sum(gammaln(0.5 * (dof - np.arange(n_features)[:, None])), axis=0)
    )


class VariationalMixtureAccumulator(Accumulator):
    """A Gaussian mixture's accumulator (the same component sums) and the entropy of the
    responsibilities, ``-Σ r log r``, as one more sum. Its value is ``(counts, component
    values, entropy)``."""

    def __init__(self, mixture: MixtureAccumulator):
        self.mixture = mixture
        self.entropy = 0.0

    def seq_update(self, enc: Any, weights: np.ndarray | torch.Tensor | None, model: VariationalGaussianMixture) -> Any:
        """The E-step under ``model`` (the mixture's own), and the entropy of its responsibilities."""
        before = [acc.value() for acc in self.mixture.accumulators]
        log_normaliser = self.mixture.seq_update(enc, weights, model)
        added = [acc.value() - old for acc, old in zip(self.mixture.accumulators, before)]
        references = [acc.reference for acc in self.mixture.accumulators]
        weighted = log_normaliser if weights is None else log_normaliser * _like(weights, log_normaliser)
        self.entropy += total(weighted) - model.component_log_joint_sums(added, references)
        return log_normaliser

    def seq_update_responsibilities(self, enc: Any, resp: torch.Tensor, references: np.ndarray | None = None) -> None:
        """Add ``enc`` with given ``(K, N)`` responsibilities (a start; no entropy)."""
        self.mixture.seq_update_responsibilities(enc, resp, references)

    def value(self) -> tuple[np.ndarray, list[Any], float]:
        counts, components = self.mixture.value()
        return counts, components, self.entropy

    def from_value(self, value: tuple) -> VariationalMixtureAccumulator:
        self.mixture.from_value(value[:2])
        self.entropy = float(value[2])
        return self

    def combine(self, value: tuple) -> VariationalMixtureAccumulator:
        self.mixture.combine(value[:2])
        self.entropy += float(value[2])
        return self

    def key_merge(self, stats: dict) -> None:
        """No keys: the variational update pools the tied type's scatter itself."""

    def key_replace(self, stats: dict) -> None:
        """No keys (see :meth:`key_merge`)."""

    def acc_to_encoder(self) -> Encoder:
        return self.mixture.acc_to_encoder()


def _like(weights: np.ndarray | torch.Tensor, values: Any) -> Any:
    """``weights`` as the kind of ``values`` (a numpy array or a tensor on its device)."""
    if isinstance(values, torch.Tensor):
        return torch.as_tensor(weights, dtype=torch.float64, device=values.device)
    return np.asarray(weights, dtype=np.float64)


class VariationalGaussianMixtureEstimator(Estimator):
    """The variational update of a Gaussian mixture in place of EM's M-step.

    ``estimate(count, value)`` turns the folded statistics of an E-step under a
    :class:`VariationalGaussianMixture` (``(counts, component values, entropy)``) into the
    next one, carrying the lower bound; :meth:`start` turns statistics taken with given
    responsibilities (``(counts, component values)``) into a start, as scikit-learn's
    ``_initialize`` does. ``dtype`` is the E-step's (float64 by default; float32 keeps the
    statistics, the entropy and the update in float64, as the Gaussian mixture's does)."""

    def __init__(self, n_components: int, n_features: int, priors: VariationalPriors, dtype: Any = None):
        self.n_components, self.n_features, self.priors = n_components, n_features, priors
        self.full = full_statistics(priors.covariance_type, n_features)
        self.dtype = None if dtype is None else encoding_dtype(dtype)

    def gaussian_estimator(self) -> MixtureEstimator:
        """A Gaussian mixture's estimator with this type's component statistics, untied (the
        variational update pools the tied type's scatter itself), its E-step in ``dtype``:
        what a start's statistics and a handle's encoding come from."""
        d, reg = self.n_features, self.priors.reg_covar
        component: Estimator
        if self.full:
            component = MultivariateGaussianEstimator(dim=d, reg_covar=reg)
        else:
            component = DiagonalGaussianEstimator(dim=d, reg_covar=reg)
        return MixtureEstimator([component] * self.n_components, dtype=self.dtype)

    def make_accumulator(self) -> VariationalMixtureAccumulator:
        return VariationalMixtureAccumulator(self.gaussian_estimator().make_accumulator())

    def estimate(self, nobs: float | None, value: tuple) -> VariationalGaussianMixture:
        """The variational update from an E-step's folded statistics, with its lower bound."""
        model = self.start(value[:2])
        return _with_lower_bound(model, float(value[2]))

    def start(self, value: tuple, unassigned: np.ndarray | None = None) -> VariationalGaussianMixture:
        """The update from ``(counts, component values)``: scikit-learn's ``_m_step``.

        ``unassigned`` (tied only): ``Σ_n (1 - Σ_k r_nk) x_n x_nᵀ`` of starting
        responsibilities whose rows do not sum to 1, which scikit-learn's tied covariance
        counts (it takes ``XᵀX`` over every row)."""
        nk, xk, sk = self._moments(value[1], unassigned)
        p = self.priors
        if p.prior_type == "dirichlet_process":
            concentration: Any = (1.0 + nk, p.weight_concentration + np.hstack((np.cumsum(nk[::-1])[-2::-1], 0)))
        else:
            concentration = p.weight_concentration + nk
        mean_precision = p.mean_precision + nk
        means = (p.mean_precision * p.mean + nk[:, None] * xk) / mean_precision[:, None]
        diff = xk - p.mean
        shrink = p.mean_precision / mean_precision
        kind = p.covariance_type
        if kind == "full":
            dof: Any = p.degrees_of_freedom + nk
            outer = np.einsum("ki,kj->kij", diff, diff)
            covariances = (p.covariance + nk[:, None, None] * sk + (nk * shrink)[:, None, None] * outer) / dof[
                :, None, None
            ]
            covariances = 0.5 * (covariances + np.swapaxes(covariances, 1, 2))  # symmetric to the last bit
        elif kind == "tied":
            dof = p.degrees_of_freedom + nk.sum() / self.n_components
            covariances = (
                p.covariance
                + sk * nk.sum() / self.n_components
                + p.mean_precision / self.n_components * np.dot((nk / mean_precision) * diff.T, diff)
            ) / dof
            covariances = 0.5 * (covariances + covariances.T)
        elif kind == "diag":
            dof = p.degrees_of_freedom + nk
            covariances = (p.covariance + nk[:, None] * (sk + shrink[:, None] * np.square(diff))) / dof[:, None]
        else:
            dof = p.degrees_of_freedom + nk
            covariances = (p.covariance + nk * (sk + shrink * np.mean(np.square(diff), axis=1))) / dof
        return VariationalGaussianMixture(p, concentration, mean_precision, means, dof, covariances)

    def _moments(
        self, components: Sequence[np.ndarray], unassigned: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """scikit-learn's ``nk, xk, sk`` (``_estimate_gaussian_parameters``) from the sums."""
        d, kind, reg = self.n_features, self.priors.covariance_type, self.priors.reg_covar
        counts, means, scatters = [], [], []
        for stats in components:
            n, nc, s1, s2 = _split(np.asarray(stats, dtype=np.float64), self.full)
            if np.size(n) == 0 or not np.isfinite(n):
                raise ValueError("a component's statistics are empty or not finite")
            count = n + TINY_COUNT
            mean = (nc + s1) / count
            offset = mean - (nc / n if n > 0 else 0.0)
            if self.full:
                scatter = s2 - np.outer(s1, offset) - np.outer(offset, s1) + n * np.outer(offset, offset)
            else:
                scatter = s2 - 2.0 * offset * s1 + n * offset * offset
            counts.append(count)
            means.append(mean)
            scatters.append(scatter)
        nk, xk = np.array(counts), np.stack(means)
        scatter = np.stack(scatters)
        if kind == "tied":
            pooled = scatter.sum(axis=0)
            pooled = (pooled if self.full else np.diag(pooled)) + (0.0 if unassigned is None else unassigned)
            pooled = pooled / nk.sum()
            return nk, xk, pooled + reg * np.eye(d)
        per_component = scatter / (nk[:, None, None] if self.full else nk[:, None])
        if kind == "full":
            per_component = per_component if self.full else per_component[:, :, None]
            return nk, xk, per_component + reg * np.eye(d)
        if kind == "diag":
            return nk, xk, per_component + reg
        return nk, xk, per_component.mean(axis=1) + reg


def _with_lower_bound(model: VariationalGaussianMixture, entropy: float) -> VariationalGaussianMixture:
    """``model`` with the lower bound of its step (scikit-learn's ``_compute_lower_bound``):
    the E-step's entropy and the Wishart, weight and mean-precision terms of ``model``."""
    p = model.priors
    d = model.means.shape[1]
    dof = model.degrees_of_freedom
    log_det = log_det_cholesky(p.covariance_type, model.precisions_cholesky, d) - 0.5 * d * np.log(dof)
    if p.covariance_type == "tied":
        log_wishart = len(model.means) * float(log_wishart_norm(dof, log_det, d)[0])
    else:
        log_wishart = float(np.sum(log_wishart_norm(dof, log_det, d)))
    if p.prior_type == "dirichlet_process":
        log_norm_weight = -float(np.sum(betaln(*model.weight_concentration)))
    else:
        concentration = model.weight_concentration
        log_norm_weight = float(gammaln(np.sum(concentration)) - np.sum(gammaln(concentration)))
    model.lower_bound = entropy - log_wishart - log_norm_weight - 0.5 * d * float(np.sum(np.log(model.mean_precision)))
    return model
