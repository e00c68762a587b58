"""``GMMHMM``: hmmlearn's HMM with a Gaussian mixture per state.

The states emit from the Gaussian-mixture family of
:mod:`mixle_nb.stats.hmm.gaussian_mixture_emission`: the E-step's state posteriors are split
among each state's components by the state's mixture accumulator, whose statistics are the
Gaussians' centred sums. The M-step is hmmlearn's (its weights, means and covariance priors, and
its covariances about the means the E-step ran under), computed from those sums.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
from scipy import linalg
from sklearn import cluster
from sklearn.utils import check_random_state

from ..stats.hmm import HiddenMarkovDistribution, HiddenMarkovEstimator
from ..stats.hmm.gaussian_mixture_emission import (
    gaussian_mixture_arrays,
    gaussian_mixture_estimator,
    gaussian_mixture_states,
    state_estimator,
)
from ..stats.multivariate_gaussian import MultivariateGaussianEstimator
from .base import BaseHMM, _fit_on_rank, is_handle, is_reference
from .covariances import COVARIANCE_TYPES, fill_covars
from .gaussian import centred_state_sums, positive_definite

if TYPE_CHECKING:
    from numpy.typing import ArrayLike
    from typing_extensions import Self

_log = logging.getLogger(__name__)
EMISSION_CODES = (("w", "weights_"), ("m", "means_"), ("c", "covars_"))


@dataclass(frozen=True)
class MixturePriors:
    """hmmlearn's ``GMMHMM`` priors broadcast to their shapes (its ``_fix_priors_shape``), with
    the covariance type's defaults for ``covars_prior`` / ``covars_weight`` left ``None``."""

    weights_prior: np.ndarray
    means_prior: np.ndarray
    means_weight: np.ndarray
    covars_prior: np.ndarray
    covars_weight: np.ndarray

    @classmethod
    def of(cls, face: GMMHMM) -> MixturePriors:
        """The priors of ``face`` (its ``n_features`` set), hmmlearn's message on a bad shape."""
        nc, nf, nm, kind = face.n_components, face.n_features, face.n_mix, face.covariance_type
        defaults = {
            "full": (0.0, -(1.0 + nf + 1.0)),
            "tied": (0.0, -(nm + nf + 1.0)),
            "diag": (-1.5, 0.0),
            "spherical": (-(nm + 2.0) / 2.0, 0.0),
        }[kind]
        covars_prior = defaults[0] if face.covars_prior is None else face.covars_prior
        covars_weight = defaults[1] if face.covars_weight is None else face.covars_weight
        shapes = {
            "full": ((nc, nm, nf, nf), (nc, nm)),
            "tied": ((nc, nf, nf), (nc,)),
            "diag": ((nc, nm, nf), (nc, nm, nf)),
            "spherical": ((nc, nm), (nc, nm)),
        }[kind]
        return cls(
            np.broadcast_to(np.asarray(face.weights_prior, dtype=np.float64), (nc, nm)).copy(),
            np.broadcast_to(np.asarray(face.means_prior, dtype=np.float64), (nc, nm, nf)).copy(),
            np.broadcast_to(np.asarray(face.means_weight, dtype=np.float64), (nc, nm)).copy(),
            np.broadcast_to(np.asarray(covars_prior, dtype=np.float64), shapes[0]).copy(),
            np.broadcast_to(np.asarray(covars_weight, dtype=np.float64), shapes[1]).copy(),
        )


def _outer(x: np.ndarray) -> np.ndarray:
    """Outer products over the last axis."""
    return x[..., :, None] * x[..., None, :]


class GaussianMixtureUpdate:
    """hmmlearn's ``GMMHMM`` M-step for the emissions (picklable: it crosses to the ranks)."""

    def __init__(self, face: GMMHMM):
        self.covariance_type, self.params, self.priors = face.covariance_type, face.params, MixturePriors.of(face)
        self.weights, self.means, self.covars = face.weights_, face.means_, face.covars_

    def _sums(self, values: list) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per state and component: the posterior mass (K, M), the weighted sum of the data
        (K, M, D), and the weighted scatter about the previous means (K, M, D[, D])."""
        full = self.covariance_type in ("full", "tied")
        post_mix, data_sum, scatter = [], [], []
        for counts, component_values, old_means in zip((v[0] for v in values), (v[1] for v in values), self.means):
            n, mean, about_mean = centred_state_sums(component_values, full)
            shift = mean - old_means  # Σw(x-μ)(x-μ)ᵀ = scatter + n (x̄-μ)(x̄-μ)ᵀ
            post_mix.append(np.asarray(counts, dtype=np.float64))
            data_sum.append(n[:, None] * mean)
            scatter.append(
                about_mean + n[:, None, None] * _outer(shift) if full else about_mean + n[:, None] * shift**2
            )
        return np.array(post_mix), np.array(data_sum), np.array(scatter)

    def __call__(self, occupancy: np.ndarray, values: list, previous: HiddenMarkovDistribution) -> list:
        post_mix_sum, data_sum, c_n = self._sums(values)
        p = self.priors
        nf = self.means.shape[-1]
        nm = post_mix_sum.shape[1]
        weights, means, covars = self.weights, self.means, self.covars
        if "w" in self.params:
            alphas_minus_one = p.weights_prior - 1
            weights = (post_mix_sum + alphas_minus_one) / (occupancy + alphas_minus_one.sum(axis=1))[:, None]
        if "m" in self.params:
            m_n = p.means_weight[:, :, None] * p.means_prior + data_sum
            m_d = post_mix_sum + p.means_weight
            m_d[(weights == 0) & (m_n == 0).all(axis=-1)] = 1  # an unused component's mean: 0, not 0 / 0
            means = m_n / m_d[:, :, None]
        if "c" in self.params:
            lambdas, centred_means = p.means_weight, means - p.means_prior
            if self.covariance_type == "full":
                numerator = np.swapaxes(p.covars_prior, -1, -2) + lambdas[:, :, None, None] * _outer(centred_means)
                denominator = (post_mix_sum + 1 + p.covars_weight + nf + 1)[:, :, None, None]
            elif self.covariance_type == "diag":
                numerator = lambdas[:, :, None] * centred_means**2 + 2 * p.covars_weight
                denominator = post_mix_sum[:, :, None] + 1 + 2 * (p.covars_prior + 1)
            elif self.covariance_type == "spherical":
                numerator = lambdas * np.einsum("...i,...i", centred_means, centred_means) + 2 * p.covars_weight
                c_n = c_n.sum(axis=-1)
                denominator = nf * (post_mix_sum + 1) + 2 * (p.covars_prior + 1)
            else:
                numerator = np.einsum("ij,ijkl->ikl", lambdas, _outer(centred_means)) + np.swapaxes(
                    p.covars_prior, -1, -2
                )
                c_n = c_n.sum(axis=1)
                denominator = (occupancy + nm + p.covars_weight + nf + 1)[:, None, None]
            with np.errstate(divide="ignore", invalid="ignore"):  # named below, if it happens
                covars = (numerator + c_n) / denominator
        degenerate_components(weights, covars, post_mix_sum, self.covariance_type)
        return mixture_states(self.covariance_type, weights, means, covars)


def degenerate_components(weights: np.ndarray, covars: np.ndarray, mass: np.ndarray, covariance_type: str) -> None:
    """Raise, naming the first state and component, when the M-step gave a negative weight or
    a covariance that is not finite and positive (hmmlearn carries NaN on: a component of
    weight 0 has no data, and the default priors then divide 0 by 0)."""
    bad_weight = weights < 0
    if covariance_type == "tied":
        bad_covar = ~np.isfinite(covars).all(axis=(1, 2))[:, None] & np.ones_like(bad_weight)
    else:
        per_component = covars.reshape(covars.shape[0], covars.shape[1], -1)
        bad_covar = ~np.isfinite(per_component).all(axis=-1)
        if covariance_type in ("spherical", "diag"):
            bad_covar |= (per_component <= 0).any(axis=-1)
    bad = bad_weight | bad_covar
    if bad.any():
        k, j = (int(i) for i in np.argwhere(bad)[0])
        what = f"weight of {weights[k, j]:.3g}" if bad_weight[k, j] else "covariance that is not finite and positive"
        raise ValueError(
            f"state {k}, mixture component {j}: the M-step gave it a {what} from a posterior mass of "
            f"{mass[k, j]:.3g}; start it with a weight > 0, or give weights_prior >= 1 and a covars_prior "
            "that keeps an unused component's covariance positive"
        )


def mixture_states(covariance_type: str, weights: np.ndarray, means: np.ndarray, covars: np.ndarray) -> list:
    """Each state's mixture in our families; a full covariance that is not positive definite
    with hmmlearn's ``MIN_COVAR`` on its diagonal, as hmmlearn's density takes it."""
    if covariance_type == "full":
        covars = np.stack([np.stack([positive_definite(c) for c in state]) for state in covars])
    elif covariance_type == "tied":
        covars = np.stack([positive_definite(c) for c in covars])
    return gaussian_mixture_states(weights, means, covars, covariance_type)


class GMMHMM(BaseHMM):
    """Hidden Markov model with a Gaussian mixture per state, as :class:`hmmlearn.hmm.GMMHMM`.

    Parameters
    ----------
    n_components : int
        Number of states.
    n_mix : int
        Number of Gaussian components of each state's mixture.
    min_covar : float
        Added to the diagonal of the data's covariance that starts ``covars_``.
    startprob_prior, transmat_prior : array-like or float
        Dirichlet priors of ``startprob_`` and of each row of ``transmat_``.
    weights_prior : array-like or float, shape (n_mix,) or (n_components, n_mix)
        Dirichlet prior of each state's ``weights_``.
    means_prior, means_weight : array-like or float
        Mean and precision of the normal prior of ``means_``.
    covars_prior, covars_weight : array-like or float, optional
        Inverse-gamma (``"spherical"``, ``"diag"``) or inverse-Wishart (``"full"``,
        ``"tied"``) prior of ``covars_``; ``None`` takes hmmlearn's default for the covariance
        type (with it, ``"diag"``, ``"full"`` and ``"tied"`` divide the scatter by the
        posterior mass alone).
    algorithm : {"viterbi", "map"}
        Decoder of :meth:`decode` and :meth:`predict`.
    covariance_type : {"spherical", "diag", "full", "tied"}
        One variance per component, a diagonal per component, a full covariance per
        component, or one full covariance shared by the components of each state.
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
        transmat, ``m`` means, ``c`` covars, ``w`` mixture weights.
    implementation : {"log", "scaling"}
        Forward–backward in log space or scaled.

    Attributes
    ----------
    n_features : int
    monitor_ : ConvergenceMonitor
    startprob_ : ndarray, shape (n_components,)
    transmat_ : ndarray, shape (n_components, n_components)
    weights_ : ndarray, shape (n_components, n_mix)
    means_ : ndarray, shape (n_components, n_mix, n_features)
    covars_ : ndarray
        (n_components, n_mix) ``"spherical"``, (n_components, n_mix, n_features) ``"diag"``,
        (n_components, n_mix, n_features, n_features) ``"full"``, (n_components, n_features,
        n_features) ``"tied"``.

    Examples
    --------
    >>> import numpy as np
    >>> from mixle_nb.hmm import GMMHMM
    >>> rng = np.random.default_rng(0)
    >>> X = np.concatenate([rng.normal(0, 1, (60, 2)), rng.normal(8, 1, (60, 2))])
    >>> m = GMMHMM(n_components=2, n_mix=2, n_iter=5, random_state=0).fit(X)
    >>> m.weights_.shape, m.means_.shape, m.covars_.shape
    ((2, 2), (2, 2, 2), (2, 2, 2))
    """

    weights_: np.ndarray
    means_: np.ndarray
    covars_: np.ndarray

    def __init__(
        self,
        n_components: int = 1,
        n_mix: int = 1,
        min_covar: float = 1e-3,
        startprob_prior: float | np.ndarray = 1.0,
        transmat_prior: float | np.ndarray = 1.0,
        weights_prior: float | np.ndarray = 1.0,
        means_prior: float | np.ndarray = 0.0,
        means_weight: float | np.ndarray = 0.0,
        covars_prior: float | np.ndarray | None = None,
        covars_weight: float | np.ndarray | None = None,
        algorithm: str = "viterbi",
        covariance_type: str = "diag",
        random_state: Any = None,
        n_iter: int = 10,
        tol: float = 1e-2,
        verbose: bool = False,
        params: str = "stmcw",
        init_params: str = "stmcw",
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
        self.n_mix = n_mix
        self.weights_prior = weights_prior
        self.means_prior = means_prior
        self.means_weight = means_weight
        self.covars_prior = covars_prior
        self.covars_weight = covars_weight

    def _get_n_fit_scalars_per_param(self) -> dict:
        nc, nf, nm = self.n_components, self.n_features, self.n_mix
        return {
            "s": nc - 1,
            "t": nc * (nc - 1),
            "m": nc * nm * nf,
            "c": {
                "spherical": nc * nm,
                "diag": nc * nm * nf,
                "full": nc * nm * nf * (nf + 1) // 2,
                "tied": nc * nf * (nf + 1) // 2,
            }[self.covariance_type],
            "w": nm - 1,  # hmmlearn 0.3.3 counts one state's weights
        }

    def _init_emissions(self, X: np.ndarray | None, lengths: np.ndarray | None) -> None:
        if X is None:  # on a handle: started by fit before the chain (_start_on_handle)
            return
        needs = {code: self._needs_init(code, name) for code, name in EMISSION_CODES}
        cv = np.atleast_2d(np.cov(X.T) + self.min_covar * np.eye(self.n_features))
        if needs["w"]:
            self.weights_ = np.full((self.n_components, self.n_mix), 1 / self.n_mix)
        if needs["m"]:
            self.means_ = self._kmeans_means(X, cv)
        if needs["c"]:
            self._start_covars(cv)

    def _start_covars(self, cv: np.ndarray) -> None:
        """hmmlearn's start of ``covars_``: the data's covariance ``cv`` (with ``min_covar``
        on its diagonal) in every component, in the covariance type's shape."""
        nc, nf, nm = self.n_components, self.n_features, self.n_mix
        shapes = {"tied": (nc, nf, nf), "full": (nc, nm, nf, nf), "diag": (nc, nm, nf), "spherical": (nc, nm)}
        start = {"tied": cv, "full": cv, "diag": np.diag(cv), "spherical": cv.mean()}
        if self.covariance_type not in COVARIANCE_TYPES:
            raise ValueError(f"covariance_type must be one of {COVARIANCE_TYPES}")
        self.covars_ = np.zeros(shapes[self.covariance_type])
        self.covars_[:] = start[self.covariance_type]

    def fit(self, X: Any, lengths: ArrayLike | None = None) -> Self:
        """Estimate the parameters with EM (Baum–Welch), as :meth:`BaseHMM.fit`.

        On a handle of sequences (or ``cluster.handle(name)``) the emission parameters that
        ``init_params`` names, or that are not set, start where the sequences live, as the
        array start does with scikit-learn's k-means: uniform ``weights_``; ``means_`` from
        k-means‖ of the states over every observation, then of each state's components
        over the observations nearest its centre; ``covars_`` from the data's covariance
        (its maximum-likelihood estimate over every rank) plus ``min_covar``. The start is
        the same on every rank. k-means‖'s draws depend on the seed and the number of
        ranks; where the data's clusters are clear, every draw ends in the same partition,
        so one process and any number of ranks start alike (to rounding).

        Parameters
        ----------
        X : array-like, shape (n_samples, n_features), a handle of sequences, or a cluster reference
            As :meth:`BaseHMM.fit`; a handle can be built with the family of
            :func:`~mixle_nb.stats.hmm.gaussian_mixture_estimator` before any parameter is set.
        lengths : array-like of int, shape (n_sequences,), optional
            The sequences' lengths (arrays only).

        Returns
        -------
        self : object
            Fitted.

        Raises
        ------
        ValueError
            As :meth:`BaseHMM.fit`; on a handle without a k-means start (``pysp_kmeans_init``),
            emission parameters to start.

        Examples
        --------
        >>> import numpy as np
        >>> from mixle_nb.hmm import GMMHMM
        >>> from mixle_nb.parallel import TorchRunEncodedData
        >>> from mixle_nb.stats.hmm import gaussian_mixture_estimator
        >>> rng = np.random.default_rng(0)
        >>> seqs = [rng.normal(0, 1, (40, 1)) + 6 * (rng.random((40, 1)) < 0.5) for _ in range(4)]
        >>> family = gaussian_mixture_estimator(2, 2, dim=1)
        >>> with TorchRunEncodedData(seqs, estimator=family, init_process_group=False) as handle:
        ...     m = GMMHMM(2, n_mix=2, n_iter=3, random_state=0).fit(handle)
        >>> m.means_.shape, m.n_features
        ((2, 2, 1), 1)
        """
        if not (is_handle(X) or is_reference(X)) or not self._emissions_to_start():
            return super().fit(X, lengths)
        if is_reference(X):  # started and fitted where the sequences live; rank 0's result comes back
            self.__dict__.update(vars(X.call_with_handle(_fit_on_rank, self)))
            return self
        self._start_on_handle(X)
        kept = self.init_params
        self.init_params = "".join(code for code in kept if code not in "wmc")  # started above
        try:
            return super().fit(X)
        finally:
            self.init_params = kept

    def _emissions_to_start(self) -> bool:
        """Whether ``init_params`` names an emission parameter, or one is not set."""
        return any(code in self.init_params or not hasattr(self, name) for code, name in EMISSION_CODES)

    def _start_on_handle(self, handle: Any) -> None:
        """The emission parameters ``init_params`` names (or not set) started on ``handle``:
        k-means‖ in two levels (:mod:`mixle_nb.stats.hmm.starts`) for the means, one pass of
        a one-state model for the data's covariance."""
        if not hasattr(handle, "pysp_kmeans_init"):
            raise ValueError(
                f"{type(handle).__name__} has no k-means start (pysp_kmeans_init): set weights_, means_ and "
                "covars_ and leave 'w', 'm' and 'c' out of init_params"
            )
        needs = {code: self._needs_init(code, name) for code, name in EMISSION_CODES}
        random_state = check_random_state(self.random_state)
        states = gaussian_mixture_estimator(self.n_components, self.n_mix, "diag", reg_covar=0.0)
        means = gaussian_mixture_arrays(handle.pysp_kmeans_init(states, random_state).emissions, "diag")[1]
        self._check_and_set_n_features(means[0])
        if needs["w"]:
            self.weights_ = np.full((self.n_components, self.n_mix), 1 / self.n_mix)
        if needs["m"]:
            self.means_ = means
        if needs["c"]:
            whole = HiddenMarkovEstimator([MultivariateGaussianEstimator(self.n_features, reg_covar=0.0)])
            covar = handle.pysp_kmeans_init(whole, random_state).emissions[0].covar
            self._start_covars(covar + self.min_covar * np.eye(self.n_features))

    def _kmeans_means(self, X: np.ndarray, cv: np.ndarray) -> np.ndarray:
        """hmmlearn's start of the means: k-means of the states, then of the components within
        each state's cluster; a cluster with fewer points than ``n_mix`` draws its components'
        means about the centroid of the states' centres (from ``random_state``; hmmlearn draws
        them from NumPy's global generator)."""
        main = cluster.KMeans(n_clusters=self.n_components, random_state=self.random_state, n_init=10)
        labels = main.fit_predict(X)
        centroid = np.mean(main.cluster_centers_, axis=0)
        random_state = check_random_state(self.random_state)
        means = []
        for label in range(self.n_components):
            members = X[labels == label]
            if len(members) >= self.n_mix:
                kmeans = cluster.KMeans(n_clusters=self.n_mix, random_state=self.random_state, n_init=10)
                means.append(kmeans.fit(members).cluster_centers_)
            else:
                means.append(random_state.multivariate_normal(centroid, cov=cv, size=self.n_mix))
        return np.stack(means)

    def _check_emissions(self) -> None:
        """hmmlearn's ``GMMHMM._check`` after the chain's, with its messages."""
        self.means_ = np.array(self.means_)
        if not hasattr(self, "n_features"):
            self.n_features = self.means_.shape[2]
        nc, nf, nm = self.n_components, self.n_features, self.n_mix
        if self.covariance_type not in COVARIANCE_TYPES:
            raise ValueError(f"covariance_type must be one of {COVARIANCE_TYPES}")
        MixturePriors.of(self)  # a prior of the wrong shape fails here, before any work
        self.weights_ = np.array(self.weights_)
        if self.weights_.shape != (nc, nm):
            raise ValueError(f"weights_ must have shape (n_components, n_mix), actual shape: {self.weights_.shape}")
        self._check_sum_1("weights_")
        if self.means_.shape != (nc, nm, nf):
            raise ValueError(
                f"means_ must have shape (n_components, n_mix, n_features), actual shape: {self.means_.shape}"
            )
        self.covars_ = np.array(self.covars_)
        needed = {"spherical": (nc, nm), "tied": (nc, nf, nf), "diag": (nc, nm, nf), "full": (nc, nm, nf, nf)}
        if self.covars_.shape != needed[self.covariance_type]:
            raise ValueError(
                f"{self.covariance_type!r} mixture covars must have shape {needed[self.covariance_type]}, "
                f"actual shape: {self.covars_.shape}"
            )
        if self.covariance_type in ("spherical", "diag"):
            if np.any(self.covars_ < 0):
                raise ValueError(f"{self.covariance_type!r} mixture covars must be non-negative")
            if np.any(self.covars_ == 0):
                _log.warning("Degenerate mixture covariance")
        elif self.covariance_type == "tied":
            for i, covar in enumerate(self.covars_):
                self._check_symmetric_positive(covar, f"state #{i}")
        else:
            for i, mix_covars in enumerate(self.covars_):
                for j, covar in enumerate(mix_covars):
                    self._check_symmetric_positive(covar, f"state #{i}, mixture #{j}")

    @staticmethod
    def _check_symmetric_positive(covar: np.ndarray, which: str) -> None:
        """hmmlearn's check of one covariance matrix, named ``which``."""
        if not np.allclose(covar, covar.T):
            raise ValueError(f"Covariance of {which} is not symmetric")
        smallest = linalg.eigvalsh(covar).min()
        if smallest < 0:
            raise ValueError(f"Covariance of {which} is not positive definite")
        if smallest == 0:
            _log.warning("Covariance of %s has a null eigenvalue.", which)

    def _emissions(self) -> list:
        return mixture_states(self.covariance_type, self.weights_, self.means_, self.covars_)

    def _emission_estimators(self) -> list:
        """The states' family (its accumulators gather the E-step's sums; hmmlearn's M-step
        is :class:`GaussianMixtureUpdate`'s): what a copy of a state fits, as choosing the
        number of states does, by maximum likelihood."""
        return [state_estimator(self.n_mix, self.covariance_type, self.n_features, 0.0)] * self.n_components

    def _emission_update(self) -> GaussianMixtureUpdate:
        return GaussianMixtureUpdate(self)

    def _set_emissions(self, model: HiddenMarkovDistribution) -> None:
        self.weights_, self.means_, self.covars_ = gaussian_mixture_arrays(model.emissions, self.covariance_type)

    def _generate_sample_from_state(self, state: int, random_state: np.random.RandomState) -> np.ndarray:
        i_gauss = random_state.choice(self.n_mix, p=self.weights_[state])
        if self.covariance_type == "tied":
            covs = self.covars_
        else:
            covs = fill_covars(self.covars_[:, i_gauss], self.covariance_type, self.n_components, self.n_features)
        return random_state.multivariate_normal(self.means_[state, i_gauss], covs[state])


__all__ = ["GMMHMM"]
