"""``GaussianHMM``: hmmlearn's Gaussian HMM (spherical, diagonal, full and tied covariances).

The states emit from our Gaussian families (:class:`~mixle_nb.stats.DiagonalGaussianDistribution`
for ``spherical`` and ``diag``, :class:`~mixle_nb.stats.MultivariateGaussianDistribution` for
``full`` and ``tied``), whose kernels and centred statistics the E-step uses; the M-step is
hmmlearn's (its priors ``means_prior``, ``means_weight``, ``covars_prior``, ``covars_weight``),
computed from the centred sums, so it keeps its digits far from the origin.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numpy.typing import ArrayLike
from sklearn import cluster

from ..stats.centred_moments import _split
from ..stats.diagonal_gaussian import DiagonalGaussianDistribution, DiagonalGaussianEstimator
from ..stats.hmm import HiddenMarkovDistribution
from ..stats.multivariate_gaussian import MultivariateGaussianDistribution, MultivariateGaussianEstimator
from .base import BaseHMM
from .covariances import COVARIANCE_TYPES, distribute_covar_matrix, fill_covars, validate_covars


def centred_state_sums(values: list, full: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per state ``n`` (K,), the weighted mean of the data (K, D) and the scatter about it
    (K, D) or (K, D, D), from the Gaussian accumulators' centred values."""
    n, mean, scatter = [], [], []
    for value in values:
        count, nc, s1, s2 = _split(np.asarray(value, dtype=np.float64), full)
        shift = s1 / count if count > 0 else np.zeros_like(s1)
        reference = nc / count if count > 0 else np.zeros_like(nc)
        n.append(count)
        mean.append(reference + shift)
        scatter.append(s2 - (np.outer(s1, shift) if full else s1 * shift))
    return np.array(n), np.array(mean), np.array(scatter)


class GaussianUpdate:
    """hmmlearn's M-step for Gaussian emissions (picklable: it crosses to the ranks)."""

    def __init__(self, face: GaussianHMM):
        self.covariance_type, self.params = face.covariance_type, face.params
        self.means_prior, self.means_weight = face.means_prior, face.means_weight
        self.covars_prior, self.covars_weight = face.covars_prior, face.covars_weight
        self.means, self.covars = face.means_, face._covars_

    def __call__(self, occupancy: np.ndarray, values: list, previous: HiddenMarkovDistribution) -> list:
        full = self.covariance_type in ("full", "tied")
        post, data_mean, scatter = centred_state_sums(values, full)
        means_weight, means_prior = self.means_weight, self.means_prior
        denom = post[:, None]
        means = self.means
        if "m" in self.params:
            means = (means_weight * means_prior + denom * data_mean) / (means_weight + denom)
        covars = self.covars
        if "c" in self.params:
            meandiff = means - means_prior
            shift = data_mean - means  # Σw(x-μ)(x-μ)ᵀ = scatter + n (x̄-μ)(x̄-μ)ᵀ
            if self.covariance_type in ("spherical", "diag"):
                c_n = means_weight * meandiff**2 + scatter + denom * shift**2
                c_d = max(self.covars_weight - 1, 0) + denom
                covars = (self.covars_prior + c_n) / np.maximum(c_d, 1e-5)
                if self.covariance_type == "spherical":
                    covars = covars.mean(axis=1)
            else:
                k, d = means.shape
                mw = np.broadcast_to(np.asarray(means_weight, dtype=np.float64).reshape(-1), (k,))
                c_n = (
                    mw[:, None, None] * meandiff[:, :, None] * meandiff[:, None, :]
                    + scatter
                    + post[:, None, None] * shift[:, :, None] * shift[:, None, :]
                )
                cvweight = max(self.covars_weight - d, 0)
                if self.covariance_type == "tied":
                    covars = (self.covars_prior + c_n.sum(axis=0)) / (cvweight + post.sum())
                else:
                    covars = (self.covars_prior + c_n) / (cvweight + post[:, None, None])
        return state_distributions(self.covariance_type, np.asarray(means), np.asarray(covars))


def state_distributions(covariance_type: str, means: np.ndarray, covars: np.ndarray) -> list:
    """Each state's emission in our families, from hmmlearn's compact covariances."""
    k, d = means.shape
    if covariance_type == "spherical":
        variances = np.asarray(covars, dtype=np.float64).reshape(k, -1)[:, 0]
        return [DiagonalGaussianDistribution(means[i], np.full(d, variances[i])) for i in range(k)]
    if covariance_type == "diag":
        return [DiagonalGaussianDistribution(means[i], covars[i]) for i in range(k)]
    full = np.broadcast_to(covars, (k, d, d)) if covariance_type == "tied" else covars
    return [MultivariateGaussianDistribution(means[i], positive_definite(full[i])) for i in range(k)]


# hmmlearn's ``log_multivariate_normal_density``: a covariance whose Cholesky factorisation
# fails (a state stuck on too few observations) is used with this added to its diagonal
MIN_COVAR = 1e-7


def positive_definite(covar: np.ndarray) -> np.ndarray:
    """``covar`` symmetrised; with hmmlearn's ``MIN_COVAR`` on the diagonal when it is not
    positive definite, and hmmlearn's error when even that fails."""
    covar = 0.5 * (covar + covar.T)
    for attempt in (covar, covar + MIN_COVAR * np.eye(len(covar))):
        try:
            np.linalg.cholesky(attempt)
            return attempt
        except np.linalg.LinAlgError:
            continue
    raise ValueError("'covars' must be symmetric, positive-definite")


class GaussianHMM(BaseHMM):
    """Hidden Markov model with Gaussian emissions, as :class:`hmmlearn.hmm.GaussianHMM`.

    Parameters
    ----------
    n_components : int
        Number of states.
    covariance_type : {"spherical", "diag", "full", "tied"}
        One variance per state, a diagonal, a full covariance per state, or one full
        covariance shared by every state.
    min_covar : float
        Added to the diagonal of the data's covariance that starts ``covars_``.
    startprob_prior, transmat_prior : array-like or float
        Dirichlet priors of ``startprob_`` and of each row of ``transmat_``.
    means_prior, means_weight : array-like or float
        Normal prior on ``means_``.
    covars_prior, covars_weight : array-like or float
        Inverse-gamma (spherical, diag) or inverse-Wishart (full, tied) prior on ``covars_``.
    algorithm : {"viterbi", "map"}
        Decoder of :meth:`decode` and :meth:`predict`.
    random_state : RandomState or int, optional
        Seeds the start (``init_params``) and :meth:`sample`.
    n_iter : int
        Maximum EM iterations.
    tol : float
        Stop when an iteration gains less than this in log-likelihood.
    verbose : bool
        Print each iteration to stderr.
    params, init_params : str
        Parameters updated by EM / initialised by :meth:`fit`: ``s`` startprob, ``t``
        transmat, ``m`` means, ``c`` covars.
    implementation : {"log", "scaling"}
        Forward–backward in log space or scaled.

    Attributes
    ----------
    n_features : int
    monitor_ : ConvergenceMonitor
    startprob_ : ndarray, shape (n_components,)
    transmat_ : ndarray, shape (n_components, n_components)
    means_ : ndarray, shape (n_components, n_features)
    covars_ : ndarray, shape (n_components, n_features, n_features)
        Full matrices (hmmlearn's getter); set it in the compact shape of the covariance
        type: (n_components,), (n_components, n_features), (n_components, n_features,
        n_features) or (n_features, n_features), kept in ``_covars_``.

    Examples
    --------
    >>> import numpy as np
    >>> from mixle_nb.hmm import GaussianHMM
    >>> X = np.random.default_rng(0).normal(size=(100, 2))
    >>> GaussianHMM(n_components=2, random_state=0).fit(X).means_.shape
    (2, 2)
    """

    def __init__(
        self,
        n_components: int = 1,
        covariance_type: str = "diag",
        min_covar: float = 1e-3,
        startprob_prior: float | np.ndarray = 1.0,
        transmat_prior: float | np.ndarray = 1.0,
        means_prior: float | np.ndarray = 0,
        means_weight: float | np.ndarray = 0,
        covars_prior: float | np.ndarray = 1e-2,
        covars_weight: float | np.ndarray = 1,
        algorithm: str = "viterbi",
        random_state: Any = None,
        n_iter: int = 10,
        tol: float = 1e-2,
        verbose: bool = False,
        params: str = "stmc",
        init_params: str = "stmc",
        implementation: str = "log",
    ) -> None:
        super().__init__(
            n_components,
            startprob_prior=startprob_prior,
            transmat_prior=transmat_prior,
            algorithm=algorithm,
            random_state=random_state,
            n_iter=n_iter,
            tol=tol,
            verbose=verbose,
            params=params,
            init_params=init_params,
            implementation=implementation,
        )
        self.covariance_type = covariance_type
        self.min_covar = min_covar
        self.means_prior = means_prior
        self.means_weight = means_weight
        self.covars_prior = covars_prior
        self.covars_weight = covars_weight

    @property
    def covars_(self) -> np.ndarray:
        """Covariances as full matrices, (n_components, n_features, n_features)."""
        return fill_covars(self._covars_, self.covariance_type, self.n_components, self.n_features)

    @covars_.setter
    def covars_(self, covars: ArrayLike) -> None:
        covars = np.array(covars, copy=True)
        validate_covars(covars, self.covariance_type, self.n_components)
        self._covars_ = covars

    def _get_n_fit_scalars_per_param(self) -> dict:
        nc, nf = self.n_components, self.n_features
        return {
            "s": nc - 1,
            "t": nc * (nc - 1),
            "m": nc * nf,
            "c": {"spherical": nc, "diag": nc * nf, "full": nc * nf * (nf + 1) // 2, "tied": nf * (nf + 1) // 2}[
                self.covariance_type
            ],
        }

    def _init_emissions(self, X: np.ndarray | None, lengths: np.ndarray | None) -> None:
        needs_means, needs_covars = self._needs_init("m", "means_"), self._needs_init("c", "covars_")
        if X is None and (needs_means or needs_covars):
            raise ValueError(
                "fit on a handle starts from set emission parameters: set means_ and covars_ "
                "(and leave 'm' and 'c' out of init_params)"
            )
        if needs_means:
            kmeans = cluster.KMeans(n_clusters=self.n_components, random_state=self.random_state, n_init=10)
            kmeans.fit(X)
            self.means_ = kmeans.cluster_centers_
        if needs_covars:
            cv = np.cov(X.T) + self.min_covar * np.eye(X.shape[1])  # type: ignore[union-attr]  # X is set: raised above
            if not cv.shape:
                cv.shape = (1, 1)
            self.covars_ = distribute_covar_matrix(cv, self.covariance_type, self.n_components).copy()

    def _check_emissions(self) -> None:
        self.means_ = np.asarray(self.means_)
        self.n_features = self.means_.shape[1]
        if self.covariance_type not in COVARIANCE_TYPES:
            raise ValueError(f"covariance_type must be one of {COVARIANCE_TYPES}")

    def _emissions(self) -> list:
        return state_distributions(self.covariance_type, self.means_, self._covars_)

    def _emission_estimators(self) -> list:
        d = self.n_features
        if self.covariance_type in ("spherical", "diag"):
            return [DiagonalGaussianEstimator(d, reg_covar=0.0) for _ in range(self.n_components)]
        return [MultivariateGaussianEstimator(d, reg_covar=0.0) for _ in range(self.n_components)]

    def _emission_update(self) -> GaussianUpdate:
        return GaussianUpdate(self)

    def _set_emissions(self, model: HiddenMarkovDistribution) -> None:
        self.means_ = np.stack([np.asarray(e.mu, dtype=np.float64) for e in model.emissions])
        if self.covariance_type == "spherical":
            self._covars_ = np.array([float(e.sigma2[0]) for e in model.emissions])
        elif self.covariance_type == "diag":
            self._covars_ = np.stack([e.sigma2 for e in model.emissions])
        elif self.covariance_type == "tied":
            self._covars_ = model.emissions[0].covar.copy()
        else:
            self._covars_ = np.stack([e.covar for e in model.emissions])

    def _generate_sample_from_state(self, state: int, random_state: np.random.RandomState) -> np.ndarray:
        return random_state.multivariate_normal(self.means_[state], self.covars_[state])
