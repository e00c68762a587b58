"""What hmmlearn's ``BaseHMM`` does, on the HMM family of :mod:`mixle_nb.stats.hmm`.

A model's parameters live in hmmlearn's attributes (``startprob_``, ``transmat_`` and each
subclass's emission arrays); each EM iteration builds a
:class:`~mixle_nb.stats.hmm.HiddenMarkovDistribution` from them, takes one step of the core
(:func:`mixle_nb.stats.em_step`, on the encoded arrays or on a handle of sequences) with an
estimator that applies hmmlearn's M-step (its priors, and only the parameters in ``params``),
and writes the new model back. The data are validated, and encoded once, before the first step.
"""

from __future__ import annotations

import copy
import logging
import string
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

import numpy as np
from numpy.typing import ArrayLike
from sklearn.base import BaseEstimator
from sklearn.utils import check_random_state
from sklearn.utils.validation import check_array, check_is_fitted

from ..stats.estimation import em_step
from ..stats.hmm import HiddenMarkovDistribution, HiddenMarkovEstimator
from ..stats.hmm.model import normalized_rows
from .monitor import ConvergenceMonitor

if TYPE_CHECKING:
    from typing_extensions import Self

_log = logging.getLogger(__name__)
DECODER_ALGORITHMS = frozenset(("viterbi", "map"))


def is_handle(data: Any) -> bool:
    """A handle of sequences (ours or mixle's) is recognised by its ``pysp_*`` methods."""
    return hasattr(data, "pysp_em_step") or hasattr(data, "pysp_seq_estimate")


def is_reference(data: Any) -> bool:
    """A reference to a handle on a cluster's ranks (``MixleCluster.handle(name)``)."""
    return callable(getattr(data, "call_with_handle", None))


def _fit_on_rank(handle: Any, estimator: BaseHMM) -> BaseHMM:
    """What ``fit(cluster.handle(name))`` runs on every rank: the fit on the rank's handle."""
    return estimator.fit(handle)


def checked_lengths(lengths: ArrayLike | None, n_samples: int) -> np.ndarray:
    """``lengths`` as int64, summing to ``n_samples``, each >= 1 (hmmlearn's message for the sum)."""
    if lengths is None:
        return np.asarray([n_samples], dtype=np.int64)
    lengths = np.asarray(lengths)
    if lengths.ndim != 1 or (lengths.size and not np.issubdtype(lengths.dtype, np.integer)):
        if not np.all(np.asarray(lengths, dtype=np.float64) == np.round(np.asarray(lengths, dtype=np.float64))):
            raise ValueError(f"lengths must be a 1-D array of integers; got {lengths!r}")
    lengths = lengths.astype(np.int64).reshape(-1)
    cs = np.cumsum(lengths)
    if lengths.size == 0 or cs[-1] != n_samples:
        raise ValueError(f"lengths array {lengths} doesn't sum to {n_samples} samples")
    if np.any(lengths <= 0):
        bad = int(np.flatnonzero(lengths <= 0)[0])
        raise ValueError(
            f"lengths array {lengths} has length {int(lengths[bad])} at sequence {bad}: "
            "every sequence needs at least one sample"
        )
    return lengths


def finite_rows(X: np.ndarray, lengths: np.ndarray) -> None:
    """Name the sequence and position of the first NaN or infinite value."""
    if X.dtype.kind in "fc" and not np.all(np.isfinite(X)):
        row = int(np.flatnonzero(~np.isfinite(X).all(axis=1))[0])
        ends = np.cumsum(lengths)
        seq = int(np.searchsorted(ends, row, side="right"))
        position = row - int(ends[seq] - lengths[seq])
        raise ValueError(
            f"Input X contains NaN or infinity at sequence {seq}, position {position} (row {row}); "
            "drop or impute it first"
        )


class HmmlearnEstimator(HiddenMarkovEstimator):
    """hmmlearn's M-step: Dirichlet priors on the chain, probabilities that were 0 stay 0, only
    the parameters in ``params`` change, and the emissions from ``emission_update`` (a
    subclass's, with its own priors), which sees the previous model."""

    def __init__(
        self,
        estimators: list,
        previous: HiddenMarkovDistribution,
        params: str,
        emission_update: Callable[..., Any],
        face: BaseHMM,
    ) -> None:
        super().__init__(estimators, face.startprob_prior, face.transmat_prior, face.implementation)
        self.previous, self.params, self.emission_update = previous, params, emission_update

    def estimate(self, nobs: Any, value: Any) -> HiddenMarkovDistribution:
        start, transitions, occupancy, values = value
        startprob, transmat = self.previous.startprob, self.previous.transmat
        if "s" in self.params:
            new = np.maximum(np.asarray(self.startprob_prior) - 1 + start, 0)
            startprob = normalized_rows(np.where(startprob == 0, 0, new))
        if "t" in self.params:
            new = np.maximum(np.asarray(self.transmat_prior) - 1 + transitions, 0)
            transmat = normalized_rows(np.where(transmat == 0, 0, new))
        emissions = self.emission_update(occupancy, values, self.previous)
        return HiddenMarkovDistribution(emissions, startprob, transmat, self.implementation)


class BaseHMM(BaseEstimator):
    """hmmlearn's ``BaseHMM`` (EM) over our HMM family; subclasses add the emissions.

    Subclasses implement ``_emissions`` (the states' distributions from the attributes),
    ``_emission_estimators``, ``_emission_update`` (hmmlearn's M-step for the emissions, as a
    picklable callable), ``_set_emissions`` (attributes from a model), ``_init_emissions``,
    ``_check_emissions``, ``_prepare`` (``X`` checked for the family, as the encoder takes it),
    ``_get_n_fit_scalars_per_param`` and ``_generate_sample_from_state``.

    Parameters
    ----------
    n_components : int, default 1
        Number of states.
    startprob_prior, transmat_prior : float or array-like, default 1.0
        Dirichlet concentrations of the start and transition probabilities (1: maximum likelihood).
    algorithm : {"viterbi", "map"}, default "viterbi"
        The decoder of :meth:`decode` and :meth:`predict`.
    random_state : int, RandomState or None
        The random source of the starts and of :meth:`sample`.
    n_iter : int, default 10
        Most EM iterations.
    tol : float, default 1e-2
        Stop when the log-likelihood gains less than this.
    verbose : bool, default False
        Report each iteration's log-likelihood on standard error.
    params, init_params : str
        Letters of the parameters EM updates, and of those the start initialises
        (``"s"`` start, ``"t"`` transitions, then the subclass's).
    implementation : {"log", "scaling"}, default "log"
        The forward–backward arithmetic.

    Examples
    --------
    >>> import numpy as np
    >>> from mixle_nb.hmm import BaseHMM, PoissonHMM
    >>> m = PoissonHMM(2, random_state=0).fit(np.array([[1], [2], [9], [8], [1], [10]]))
    >>> isinstance(m, BaseHMM), m.transmat_.shape
    (True, (2, 2))
    """

    def __init__(
        self,
        n_components: int = 1,
        startprob_prior: float | np.ndarray = 1.0,
        transmat_prior: float | np.ndarray = 1.0,
        algorithm: str = "viterbi",
        random_state: Any = None,  # an int, a RandomState or None
        n_iter: int = 10,
        tol: float = 1e-2,
        verbose: bool = False,
        params: str = string.ascii_letters,
        init_params: str = string.ascii_letters,
        implementation: str = "log",
    ) -> None:
        self.n_components = n_components
        self.startprob_prior = startprob_prior
        self.transmat_prior = transmat_prior
        self.algorithm = algorithm
        self.random_state = random_state
        self.n_iter = n_iter
        self.tol = tol
        self.verbose = verbose
        self.params = params
        self.init_params = init_params
        self.implementation = implementation
        self.monitor_ = ConvergenceMonitor(self.tol, self.n_iter, self.verbose)

    # -- the model as our family -------------------------------------------------------
    def _model(self) -> HiddenMarkovDistribution:
        return HiddenMarkovDistribution(self._emissions(), self.startprob_, self.transmat_, self.implementation)

    def _estimator(self, model: HiddenMarkovDistribution) -> HmmlearnEstimator:
        return HmmlearnEstimator(self._emission_estimators(), model, self.params, self._emission_update(), self)

    def family_estimator(self) -> HmmlearnEstimator:
        """The estimator of this model's HMM family, for building a handle of sequences.

        Returns
        -------
        HmmlearnEstimator
            Its accumulators encode what :meth:`fit` reads (a list of sequences, each an
            (n_samples, n_features) array; for ``CategoricalHMM`` a 1-D array of symbols).

        Raises
        ------
        ValueError
            Parameters that are not set or not stochastic.

        Examples
        --------
        >>> import numpy as np
        >>> from mixle_nb.hmm import PoissonHMM
        >>> m = PoissonHMM(1, init_params="")
        >>> m.startprob_, m.transmat_, m.lambdas_ = np.array([1.0]), np.array([[1.0]]), np.array([[2.0]])
        >>> type(m.family_estimator()).__name__
        'HmmlearnEstimator'
        """
        self._check()
        return self._estimator(self._model())

    def _encode(self, X: np.ndarray, lengths: np.ndarray) -> Any:
        return self._model().dist_to_encoder().encode_concatenated(self._prepare(X), lengths)

    # -- validation ----------------------------------------------------------------------
    def _validate(self, X: Any, lengths: ArrayLike | None, fitting: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """``X`` and ``lengths`` checked (every error before any work): the array, the
        lengths, the values (NaN / infinity by sequence and position), the family's checks."""
        X = check_array(X, ensure_all_finite=False, dtype=self._dtype)
        lengths = checked_lengths(lengths, len(X))
        finite_rows(X, lengths)
        self._check_and_set_n_features(X)
        return X, lengths

    _dtype: Any = "numeric"
    startprob_: np.ndarray
    transmat_: np.ndarray
    n_features: Any

    def _check_and_set_n_features(self, X: np.ndarray) -> None:
        _, n_features = X.shape
        if hasattr(self, "n_features"):
            if self.n_features != n_features:
                raise ValueError(f"Unexpected number of dimensions, got {n_features} but expected {self.n_features}")
        else:
            self.n_features = n_features

    def _check_sum_1(self, name: str) -> None:
        s = getattr(self, name).sum(axis=-1)
        if not np.allclose(s, 1):
            raise ValueError(
                f"{name} must sum to 1 (got {s:.4f}); divide it by its sum"
                if s.ndim == 0
                else f"{name} rows must sum to 1 (got row sums of {s}); divide each row by its sum"
                if s.ndim == 1
                else "Expected 1D or 2D array"
            )

    def _check(self) -> None:
        """hmmlearn's checks of the parameters, with its messages."""
        self.startprob_ = np.asarray(self.startprob_)
        if len(self.startprob_) != self.n_components:
            raise ValueError("startprob_ must have length n_components")
        self._check_sum_1("startprob_")
        self.transmat_ = np.asarray(self.transmat_)
        if self.transmat_.shape != (self.n_components, self.n_components):
            raise ValueError("transmat_ must have shape (n_components, n_components)")
        self._check_sum_1("transmat_")
        self._check_emissions()

    def _needs_init(self, code: str, name: str) -> bool:
        if code in self.init_params:
            if hasattr(self, name):
                _log.warning(
                    "Even though the %r attribute is set, it will be overwritten during initialization "
                    "because 'init_params' contains %r",
                    name,
                    code,
                )
            return True
        return not hasattr(self, name)

    def _init(self, X: np.ndarray | None, lengths: np.ndarray | None) -> None:
        if X is not None:
            self._check_and_set_n_features(X)
        init = 1.0 / self.n_components
        random_state = check_random_state(self.random_state)
        if self._needs_init("s", "startprob_"):
            self.startprob_ = random_state.dirichlet(np.full(self.n_components, init))
        if self._needs_init("t", "transmat_"):
            self.transmat_ = random_state.dirichlet(np.full(self.n_components, init), size=self.n_components)
        if X is not None:
            per_param = self._get_n_fit_scalars_per_param()
            n_fit_scalars = sum(per_param.get(p, 0) for p in self.params)
            if X.size < n_fit_scalars:
                _log.warning(
                    "Fitting a model with %d free scalar parameters with only %d data points "
                    "will result in a degenerate solution.",
                    n_fit_scalars,
                    X.size,
                )
        self._init_emissions(X, lengths)

    # -- fitting -------------------------------------------------------------------------
    def fit(self, X: Any, lengths: ArrayLike | None = None) -> Self:
        """Estimate the parameters with EM (Baum–Welch).

        Parameters
        ----------
        X : array-like, shape (n_samples, n_features), a handle of sequences, or a cluster reference
            The samples, the sequences one after another; or a handle (``TorchRunEncodedData``
            over a list of sequences, on every rank), whose ranks fold the statistics; or
            ``cluster.handle(name)``, a reference to such a handle on a cluster's ranks, where
            the fit then runs (this estimator gets rank 0's fitted attributes back).
        lengths : array-like of int, shape (n_sequences,), optional
            The sequences' lengths, summing to ``n_samples`` (arrays only).

        Returns
        -------
        self : object
            Fitted, with ``monitor_`` holding the log-likelihood of each iteration.

        Raises
        ------
        ValueError
            ``lengths`` that do not sum to the rows or hold a zero, a NaN or infinite value
            (named by sequence and position), a family's invalid value, or parameters that
            are not stochastic; all before any work.

        Examples
        --------
        >>> import numpy as np
        >>> from mixle_nb.hmm import GaussianHMM
        >>> X = np.concatenate([np.zeros((20, 1)), np.ones((20, 1))]) + 0.1 * np.arange(40)[:, None] % 0.3
        >>> GaussianHMM(2, n_iter=5, random_state=0).fit(X, [25, 15]).monitor_.iter <= 5
        True
        """
        if is_reference(X):  # the fit runs where the sequences live; rank 0's result comes back
            probe = copy.deepcopy(self)  # a start that is not stochastic fails here, before the ranks work
            probe._init(None, None)
            probe._check()
            self.__dict__.update(vars(X.call_with_handle(_fit_on_rank, self)))
            return self
        if is_handle(X):
            enc, data = X, None
            self._init(None, None)
            self._check()
            self._check_handle(X)
        else:
            data, lengths = self._validate(X, lengths, fitting=True)
            self._init(data, lengths)
            self._check()
            enc = self._encode(data, lengths)
        self.monitor_._reset()
        for _ in range(self.n_iter):
            model = self._model()
            step = em_step(enc, self._estimator(model), model)
            self._take(cast(HiddenMarkovDistribution, step.model))
            self.monitor_.report(step.log_density)
            if self.monitor_.converged:
                break
            if (self.transmat_.sum(axis=1) == 0).any():
                _log.warning(
                    "Some rows of transmat_ have zero sum because no transition from the state was ever observed."
                )
        return self

    def _take(self, model: HiddenMarkovDistribution) -> None:
        self.startprob_, self.transmat_ = model.startprob.copy(), model.transmat.copy()
        self._set_emissions(model)

    # -- inference -----------------------------------------------------------------------
    def _ready(self, X: ArrayLike, lengths: ArrayLike | None) -> tuple[HiddenMarkovDistribution, Any]:
        check_is_fitted(self, "startprob_")
        self._check()
        X, lengths = self._validate(X, lengths)
        return self._model(), self._encode(X, lengths)

    def score_samples(self, X: ArrayLike, lengths: ArrayLike | None = None) -> tuple[float, np.ndarray]:
        """Log-likelihood of ``X`` and each sample's state posteriors.

        Parameters
        ----------
        X : array-like, shape (n_samples, n_features)
            The samples, the sequences one after another.
        lengths : array-like of int, shape (n_sequences,), optional
            The sequences' lengths, summing to ``n_samples``.

        Returns
        -------
        log_prob : float
            Log-likelihood of ``X``.
        posteriors : ndarray, shape (n_samples, n_components)
            State-membership probabilities of each sample.

        Raises
        ------
        ValueError
            Bad ``X`` or ``lengths``, or parameters that are not stochastic.

        Examples
        --------
        >>> import numpy as np
        >>> from mixle_nb.hmm import GaussianHMM
        >>> m = GaussianHMM(2, init_params="")
        >>> m.startprob_, m.transmat_ = np.array([0.5, 0.5]), np.array([[0.9, 0.1], [0.1, 0.9]])
        >>> m.means_, m.covars_ = np.array([[0.0], [3.0]]), np.array([[1.0], [1.0]])
        >>> m.score_samples(np.array([[0.1], [2.9]]))[1].shape
        (2, 2)
        """
        model, enc = self._ready(X, lengths)
        ll, posteriors = model.seq_posteriors(enc)
        return float(ll.sum()), posteriors

    def score(self, X: ArrayLike, lengths: ArrayLike | None = None) -> float:
        """Log-likelihood of ``X`` under the model.

        Parameters
        ----------
        X : array-like, shape (n_samples, n_features)
            The samples, the sequences one after another.
        lengths : array-like of int, shape (n_sequences,), optional
            The sequences' lengths, summing to ``n_samples``.

        Returns
        -------
        log_prob : float
            Log-likelihood of ``X``.

        Raises
        ------
        ValueError
            Bad ``X`` or ``lengths``, or parameters that are not stochastic.

        Examples
        --------
        >>> import numpy as np
        >>> from mixle_nb.hmm import PoissonHMM
        >>> m = PoissonHMM(1, init_params="")
        >>> m.startprob_, m.transmat_, m.lambdas_ = np.array([1.0]), np.array([[1.0]]), np.array([[2.0]])
        >>> round(m.score(np.array([[2]])), 4)
        -1.3069
        """
        model, enc = self._ready(X, lengths)
        return float(model.device_log_density(enc).sum())

    def decode(
        self, X: ArrayLike, lengths: ArrayLike | None = None, algorithm: str | None = None
    ) -> tuple[float, np.ndarray]:
        """Most likely state sequence of ``X``.

        Parameters
        ----------
        X : array-like, shape (n_samples, n_features)
            The samples, the sequences one after another.
        lengths : array-like of int, shape (n_sequences,), optional
            The sequences' lengths, summing to ``n_samples``.
        algorithm : {"viterbi", "map"}, optional
            Viterbi (the most likely path), or each sample's most likely state (MAP); the
            default is ``algorithm``.

        Returns
        -------
        log_prob : float
            Viterbi: the log-probability of the path; MAP: the sum of the largest posteriors
            (hmmlearn's value).
        state_sequence : ndarray, shape (n_samples,)
            The states.

        Raises
        ------
        ValueError
            An unknown ``algorithm``, bad ``X`` or ``lengths``.

        Examples
        --------
        >>> import numpy as np
        >>> from mixle_nb.hmm import CategoricalHMM
        >>> m = CategoricalHMM(2, init_params="")
        >>> m.startprob_, m.transmat_ = np.array([0.5, 0.5]), np.array([[0.9, 0.1], [0.1, 0.9]])
        >>> m.emissionprob_ = np.array([[0.9, 0.1], [0.2, 0.8]])
        >>> m.decode(np.array([[0], [1], [1], [1]]))[1].tolist()
        [1, 1, 1, 1]
        """
        check_is_fitted(self, "startprob_")
        self._check()
        algorithm = algorithm or self.algorithm
        if algorithm not in DECODER_ALGORITHMS:
            raise ValueError(f"Unknown decoder {algorithm!r}")
        model, enc = self._ready(X, lengths)
        if algorithm == "viterbi":
            log_prob, states = model.seq_viterbi(enc)
            return float(log_prob.sum()), states
        _, posteriors = model.seq_posteriors(enc)
        return float(np.max(posteriors, axis=1).sum()), np.argmax(posteriors, axis=1)

    def predict(self, X: ArrayLike, lengths: ArrayLike | None = None) -> np.ndarray:
        """Most likely state of each sample (:meth:`decode` with ``algorithm``).

        Parameters
        ----------
        X : array-like, shape (n_samples, n_features)
            The samples, the sequences one after another.
        lengths : array-like of int, shape (n_sequences,), optional
            The sequences' lengths.

        Returns
        -------
        state_sequence : ndarray, shape (n_samples,)

        Raises
        ------
        ValueError
            Bad ``X`` or ``lengths``.

        Examples
        --------
        >>> import numpy as np
        >>> from mixle_nb.hmm import CategoricalHMM
        >>> m = CategoricalHMM(2, init_params="")
        >>> m.startprob_, m.transmat_ = np.array([0.5, 0.5]), np.array([[0.9, 0.1], [0.1, 0.9]])
        >>> m.emissionprob_ = np.array([[0.9, 0.1], [0.2, 0.8]])
        >>> m.predict(np.array([[1], [1]])).tolist()
        [1, 1]
        """
        return self.decode(X, lengths)[1]

    def predict_proba(self, X: ArrayLike, lengths: ArrayLike | None = None) -> np.ndarray:
        """Each sample's state posteriors.

        Parameters
        ----------
        X : array-like, shape (n_samples, n_features)
            The samples, the sequences one after another.
        lengths : array-like of int, shape (n_sequences,), optional
            The sequences' lengths.

        Returns
        -------
        posteriors : ndarray, shape (n_samples, n_components)

        Raises
        ------
        ValueError
            Bad ``X`` or ``lengths``.

        Examples
        --------
        >>> import numpy as np
        >>> from mixle_nb.hmm import CategoricalHMM
        >>> m = CategoricalHMM(2, init_params="")
        >>> m.startprob_, m.transmat_ = np.array([0.5, 0.5]), np.array([[0.9, 0.1], [0.1, 0.9]])
        >>> m.emissionprob_ = np.array([[0.9, 0.1], [0.2, 0.8]])
        >>> m.predict_proba(np.array([[0]])).round(3).tolist()
        [[0.818, 0.182]]
        """
        return self.score_samples(X, lengths)[1]

    def sample(
        self,
        n_samples: int = 1,
        random_state: Any = None,  # an int, a RandomState or None
        currstate: Any = None,
    ) -> tuple[np.ndarray, np.ndarray]:
        """Draw samples from the model (hmmlearn's order of random draws, so a seed gives its samples).

        Parameters
        ----------
        n_samples : int
            Number of samples.
        random_state : RandomState or int, optional
            Defaults to ``random_state``.
        currstate : int, optional
            The state of the first sample.

        Returns
        -------
        X : ndarray, shape (n_samples, n_features)
        state_sequence : ndarray, shape (n_samples,)

        Raises
        ------
        ValueError
            Parameters that are not stochastic.

        Examples
        --------
        >>> import numpy as np
        >>> from mixle_nb.hmm import PoissonHMM
        >>> m = PoissonHMM(1, init_params="")
        >>> m.startprob_, m.transmat_, m.lambdas_ = np.array([1.0]), np.array([[1.0]]), np.array([[2.0]])
        >>> m.sample(3, random_state=0)[0].shape
        (3, 1)
        """
        check_is_fitted(self, "startprob_")
        self._check()
        random_state = check_random_state(self.random_state if random_state is None else random_state)
        transmat_cdf = np.cumsum(self.transmat_, axis=1)
        if currstate is None:
            currstate = (np.cumsum(self.startprob_) > random_state.rand()).argmax()
        states = [currstate]
        X = [self._generate_sample_from_state(currstate, random_state)]
        for _ in range(n_samples - 1):
            currstate = (transmat_cdf[currstate] > random_state.rand()).argmax()
            states.append(currstate)
            X.append(self._generate_sample_from_state(currstate, random_state))
        return np.atleast_2d(X), np.array(states, dtype=int)

    def get_stationary_distribution(self) -> np.ndarray:
        """The stationary distribution of the chain (the left eigenvector of ``transmat_``).

        Returns
        -------
        ndarray, shape (n_components,)

        Raises
        ------
        sklearn.exceptions.NotFittedError
            Before ``transmat_`` is set.

        Examples
        --------
        >>> import numpy as np
        >>> from mixle_nb.hmm import PoissonHMM
        >>> m = PoissonHMM(2)
        >>> m.transmat_ = np.array([[0.9, 0.1], [0.1, 0.9]])
        >>> m.get_stationary_distribution().round(3).tolist()
        [0.5, 0.5]
        """
        check_is_fitted(self, "transmat_")
        eigvals, eigvecs = np.linalg.eig(self.transmat_.T)
        eigvec = np.real_if_close(eigvecs[:, np.argmax(eigvals)])
        return eigvec / eigvec.sum()

    def aic(self, X: ArrayLike, lengths: ArrayLike | None = None) -> float:
        """Akaike information criterion, ``-2 log L + 2 p`` (p: every free parameter, as hmmlearn).

        Parameters
        ----------
        X : array-like, shape (n_samples, n_features)
        lengths : array-like of int, optional

        Returns
        -------
        float

        Raises
        ------
        ValueError
            Bad ``X`` or ``lengths``.

        Examples
        --------
        >>> import numpy as np
        >>> from mixle_nb.hmm import PoissonHMM
        >>> m = PoissonHMM(1, init_params="")
        >>> m.startprob_, m.transmat_, m.lambdas_ = np.array([1.0]), np.array([[1.0]]), np.array([[2.0]])
        >>> round(m.aic(np.array([[2]])), 4)
        4.6137
        """
        log_prob = self.score(X, lengths=lengths)  # first: it sets n_features
        return -2 * log_prob + 2 * sum(self._get_n_fit_scalars_per_param().values())

    def bic(self, X: Any, lengths: ArrayLike | None = None) -> float:
        """Bayesian information criterion, ``-2 log L + p log n`` (n: the samples).

        Parameters
        ----------
        X : array-like, shape (n_samples, n_features)
        lengths : array-like of int, optional

        Returns
        -------
        float

        Raises
        ------
        ValueError
            Bad ``X`` or ``lengths``.

        Examples
        --------
        >>> import numpy as np
        >>> from mixle_nb.hmm import PoissonHMM
        >>> m = PoissonHMM(1, init_params="")
        >>> m.startprob_, m.transmat_, m.lambdas_ = np.array([1.0]), np.array([[1.0]]), np.array([[2.0]])
        >>> round(float(m.bic(np.array([[2], [3]]))), 4)
        6.7315
        """
        log_prob = self.score(X, lengths=lengths)
        return -2 * log_prob + sum(self._get_n_fit_scalars_per_param().values()) * np.log(len(X))

    # -- for subclasses --------------------------------------------------------------------
    def _emissions(self) -> list:
        raise NotImplementedError

    def _emission_estimators(self) -> list:
        raise NotImplementedError

    def _emission_update(self) -> Callable[..., Any]:
        raise NotImplementedError

    def _set_emissions(self, model: HiddenMarkovDistribution) -> None:
        raise NotImplementedError

    def _init_emissions(self, X: np.ndarray | None, lengths: np.ndarray | None) -> None:
        raise NotImplementedError

    def _check_emissions(self) -> None:
        raise NotImplementedError

    def _prepare(self, X: np.ndarray) -> np.ndarray:
        return X

    def _check_handle(self, handle: Any) -> None:
        """The family's checks of a handle's sequences, on every rank together (before EM)."""

    def _get_n_fit_scalars_per_param(self) -> dict:
        raise NotImplementedError

    def _generate_sample_from_state(self, state: int, random_state: np.random.RandomState) -> Any:
        return ()
