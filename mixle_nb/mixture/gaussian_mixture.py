"""``GaussianMixture`` with scikit-learn's signature, attributes, warnings and errors, fitted
by our EM core (:func:`mixle_nb.inference.fit` from a start it builds) on an array, a handle
(``TorchRunEncodedData``, called on every rank) or a reference to a handle on the cluster's
ranks (``mixle.handle("h")``, where the fit runs where the data live)."""

from __future__ import annotations

import functools
import time
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar, cast

import numpy as np
import torch
from numpy.typing import ArrayLike
from sklearn.base import BaseEstimator, DensityMixin
from sklearn.exceptions import ConvergenceWarning
from sklearn.utils import check_random_state
from sklearn.utils.validation import check_is_fitted, validate_data

from .. import inference
from ..stats import (
    DegenerateComponentError,
    EMStep,
    MixtureDistribution,
    MixtureEstimator,
    seq_encode,
    seq_log_density_sum,
)
from ..stats.base import Distribution, Estimator
from ..stats.estimation import is_handle
from ..stats.frame import PointEncoding, encoding_dtype, with_weights
from ..stats.handle import EncodedDataHandle
from ..stats.kmeans import encoded_points
from . import scikit_internals
from .encoding_face import HandleEncoding
from .handle_weights import checked_total_weight
from .initial_parameters import checked_means, checked_precisions, checked_weights
from .sample_weights import checked_sample_weight
from .seeding import start_generator
from .stepwise import stepwise_update
from .translation import (
    covariances_from_precisions,
    mixture_estimator,
    model_from_parameters,
    parameters_from_model,
    precisions_cholesky,
    precisions_from_cholesky,
)

if TYPE_CHECKING:
    from typing_extensions import Self

# scikit-learn's message when a component's covariance cannot be estimated
ILL_DEFINED = (
    "Fitting the mixture model failed because some components have ill-defined empirical covariance "
    "(for instance caused by singleton or collapsed samples). Try to decrease the number of components, "
    "increase reg_covar, or scale the input data."
)
SAMPLE_WEIGHT_ON_RANKS = (
    "sample_weight is taken with an array X only: on ranks the weights live beside the rows, "
    "as their last column; build the handle with encoder=estimator.weighted_rows_encoder(n_features)"
)
# scikit-learn's start names, as our starts (mixle_nb.inference.initial_model). Both k-means
# names take our k-means‖ start (k-means++ seeding where the data live, one Lloyd pass, then a
# labelled M-step; k-means++ and Lloyd to convergence on at most 2,048 rows, see
# mixle_nb.stats.kmeans.kmeans_init); "random" gives every observation random responsibilities.
STARTS = {"kmeans": "kmeans++", "k-means++": "kmeans++", "random_from_data": "random_from_data", "random": "random"}
FITTED = (
    "weights_",
    "means_",
    "covariances_",
    "precisions_",
    "precisions_cholesky_",
    "converged_",
    "n_iter_",
    "lower_bound_",
    "lower_bounds_",
    "n_features_in_",
    "feature_names_in_",
)


def _array_dtype(data: Any) -> type:
    """float32 for a float32 array, else float64 (scikit-learn's dtype for attributes and results)."""
    return np.float32 if getattr(data, "dtype", None) == np.float32 else np.float64


def is_reference(data: Any) -> bool:
    """A reference to a handle on a cluster's ranks (``MixleCluster.handle(name)``)."""
    return callable(getattr(data, "call_with_handle", None))


def _handle_features(handle: Any) -> int:
    """``n_features`` of this rank's shard of ``handle`` (an empty shard keeps its dimension)."""

    def describe(enc: Any) -> np.ndarray:
        return np.array([encoded_points(enc).shape[0]])

    try:
        dims = handle.pysp_shard_map(describe)
    except ValueError:  # the same encoder on every rank: every rank raises this together
        raise ValueError(
            "GaussianMixture needs a handle of Gaussian observations: build it with "
            "estimator=GaussianMixture(...).mixture_estimator(n_features)"
        ) from None
    return int(dims[0])


def _on_rank(handle: EncodedDataHandle, estimator: GaussianMixture, method: str) -> Any:
    """What a cluster reference runs on every rank: the same method on the rank's handle."""
    out = getattr(estimator, method)(handle)
    if method not in ("fit", "partial_fit"):
        return out
    kept = (*FITTED, "_stepwise", "_weight_total")  # partial_fit's running statistics travel too
    return {name: value for name, value in vars(out).items() if name in kept}


_F = TypeVar("_F", bound=Callable[..., Any])


def _answered_on_ranks(method: _F) -> _F:
    """A method that, given a cluster reference, runs on the ranks' handle instead."""

    @functools.wraps(method)
    def on_any_data(self: Any, X: Any, *args: Any, **kwargs: Any) -> Any:
        if is_reference(X):
            return X.call_with_handle(_on_rank, self, method.__name__)
        return method(self, X, *args, **kwargs)

    return cast(_F, on_any_data)


class GaussianMixture(HandleEncoding, DensityMixin, BaseEstimator):
    """scikit-learn's ``sklearn.mixture.GaussianMixture``, on our EM core.

    The parameters, defaults and fitted attributes are scikit-learn's; see its documentation.
    ``X`` is an ``(n_samples, n_features)`` array, a ``TorchRunEncodedData`` (every rank calls
    the method; every rank gets the same answer) or a cluster reference (``mixle.handle("h")``:
    the call runs on the ranks and the answer comes back). Per-observation results are in the
    original observation order. Where ours differ: the k-means starts (``init_params="kmeans"``
    and ``"k-means++"``) are our k-means‖ start, and ``"random"`` our random responsibilities,
    so a fit agrees with scikit-learn's exactly from a given start (``weights_init``,
    ``means_init``, ``precisions_init``). ``device`` (keyword-only; ``"cpu"``, ``"cuda"``, a ``torch.device``)
    is where an array is encoded and the E-step runs; ``dtype`` (keyword-only) is the E-step's
    arithmetic, by default the input's as in scikit-learn: a float32 array is fitted with a
    float32 E-step (the sums, the objective and the parameters still in float64) and gets float32
    attributes and per-observation results.

    A handle holds Gaussian observations: build it with ``estimator=gm.mixture_estimator(n_features)``
    (or any of our Gaussian estimators).

    Parameters
    ----------
    n_components : int, default 1
        The number of mixture components.
    covariance_type : {"full", "tied", "diag", "spherical"}, default "full"
        Each component's own full covariance, one full covariance shared by all, a diagonal
        covariance each, or one variance each.
    tol : float, default 1e-3
        EM stops when the gain in the average log-likelihood per observation falls below it.
    reg_covar : float, default 1e-6
        Added to the diagonal of every covariance.
    max_iter : int, default 100
        The most EM iterations of one start.
    n_init : int, default 1
        The starts tried; the one with the highest lower bound is kept.
    init_params : {"kmeans", "k-means++", "random", "random_from_data"}, default "kmeans"
        How a start is made (see above for where ours differ from scikit-learn's).
    weights_init, means_init, precisions_init : array_like, optional
        A start given by hand, in scikit-learn's shapes and checked with its messages.
    random_state : int, numpy.random.RandomState or None, default None
        The seed of the starts and of :meth:`sample`.
    warm_start : bool, default False
        Continue from the last fit's parameters (its lower bound carried, so ``converged_``
        is set across calls as in scikit-learn).
    verbose, verbose_interval : int, default 0 and 10
        Progress printed every ``verbose_interval`` iterations when ``verbose`` > 0.
    device : str or torch.device, optional
        Where an array is encoded and the E-step runs (default: the CPU).
    dtype : {None, "float32", "float64"}, torch.dtype or numpy dtype, default None
        The E-step's arithmetic (encodings, log-densities, responsibilities): ``None`` takes the
        input array's (float32 for a float32 array, else float64; a handle's encoding is its
        own). float32 halves the encoding's memory and is the fast path on most GPUs; what it
        keeps of the numerics guarantees is in the numerics guide. The fitted attributes take
        the input array's dtype, as scikit-learn's do.

    Attributes
    ----------
    weights_, means_, covariances_, precisions_, precisions_cholesky_ : ndarray
        The fitted parameters, in scikit-learn's shapes for ``covariance_type``.
    converged_ : bool
        Whether the last fit met ``tol`` within ``max_iter``.
    n_iter_ : int
        The iterations of the best start.
    lower_bound_ : float
        The average log-likelihood per observation of the best start.
    lower_bounds_ : list of float
        That value after each iteration of the best start.
    n_features_in_ : int
        The number of features seen by ``fit``.

    See Also
    --------
    mixle_nb.mixture.BayesianGaussianMixture : The variational Bayesian mixture on the same core.

    Examples
    --------
    >>> import numpy as np
    >>> from mixle_nb.mixture import GaussianMixture
    >>> rng = np.random.default_rng(0)
    >>> X = np.concatenate([rng.normal(-4, 1, (200, 2)), rng.normal(4, 1, (200, 2))])
    >>> gm = GaussianMixture(n_components=2, random_state=0).fit(X)
    >>> np.round(np.sort(gm.means_[:, 0]))
    array([-4.,  4.])
    >>> gm.predict(np.array([[-4.0, -4.0], [4.0, 4.0]])).tolist() in ([0, 1], [1, 0])
    True

    A float32 array is fitted with the float32 E-step and gets float32 attributes:

    >>> GaussianMixture(n_components=2, random_state=0).fit(X.astype(np.float32)).means_.dtype
    dtype('float32')
    """

    lower_bounds_: list[float]
    n_features_in_: int
    _parameter_constraints: dict = {
        **scikit_internals.parameter_constraints(),
        "device": [None, str, torch.device],
        "dtype": [None, str, type, np.dtype, torch.dtype],
    }

    def __init__(
        self,
        n_components: int = 1,
        *,
        covariance_type: str = "full",
        tol: float = 1e-3,
        reg_covar: float = 1e-6,
        max_iter: int = 100,
        n_init: int = 1,
        init_params: str = "kmeans",
        weights_init: ArrayLike | None = None,
        means_init: ArrayLike | None = None,
        precisions_init: ArrayLike | None = None,
        random_state: int | np.random.RandomState | None = None,
        warm_start: bool = False,
        verbose: int = 0,
        verbose_interval: int = 10,
        device: str | torch.device | None = None,
        dtype: Any = None,
    ) -> None:
        self.n_components = n_components
        self.covariance_type = covariance_type
        self.tol = tol
        self.reg_covar = reg_covar
        self.max_iter = max_iter
        self.n_init = n_init
        self.init_params = init_params
        self.weights_init = weights_init
        self.means_init = means_init
        self.precisions_init = precisions_init
        self.random_state = random_state
        self.warm_start = warm_start
        self.verbose = verbose
        self.verbose_interval = verbose_interval
        self.device = device
        self.dtype = dtype

    # -- fitting ----------------------------------------------------------------------------

    def fit(self, X: Any, y: ArrayLike | None = None, sample_weight: ArrayLike | None = None) -> Self:
        """Estimate the parameters with EM from ``n_init`` starts; keep the best.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features), handle or cluster reference
            The observations (see the class docstring).
        y : None
            Ignored (scikit-learn's signature).
        sample_weight : array-like of shape (n_samples,), optional
            A non-negative weight per row (an array ``X`` only): a row of integer weight ``w``
            counts as ``w`` copies of it, in EM and in the k-means and random starts, and
            ``lower_bound_`` is the weighted mean log-density. ``None``: every row weighs 1.
            On ranks the weights live beside the rows instead: build the handle with
            :meth:`weighted_rows_encoder`.

        Returns
        -------
        GaussianMixture
            ``self``, fitted.

        Raises
        ------
        ValueError
            On a bad parameter, ``X`` or ``sample_weight`` (scikit-learn's messages, from its
            parameter constraints, ``validate_data`` and the ``*_init`` checks), before any
            step; or when a start collapses a component (scikit-learn's "ill-defined empirical
            covariance" message). A collapse in a later EM iteration instead keeps the last
            good model, with a ``ConvergenceWarning`` (scikit-learn issue #18216).

        Examples
        --------
        >>> import numpy as np
        >>> from mixle_nb.mixture import GaussianMixture
        >>> x = np.array([[0.0], [0.2], [5.0], [5.2]])
        >>> gm = GaussianMixture(2, random_state=0).fit(x, sample_weight=[1, 3, 1, 1])
        >>> np.round(np.sort(gm.means_.ravel()), 2)
        array([0.15, 5.1 ])
        """
        scikit_internals.validate_params(self)
        if sample_weight is not None and (is_reference(X) or is_handle(X)):
            raise ValueError(SAMPLE_WEIGHT_ON_RANKS)
        if is_reference(X):
            fitted = X.call_with_handle(_on_rank, self, "fit")
            for name in FITTED:
                self.__dict__.pop(name, None)
            self.__dict__.update(fitted)
            self._warn_unless_converged()  # the ranks' warning stays on the ranks
            return self
        self.__dict__.pop("_stepwise", None)  # a fit starts afresh; partial_fit continues from it
        data, rows, n_features = self._fit_data(X)
        weights = None if sample_weight is None else checked_sample_weight(sample_weight, rows)
        count = float(rows) if weights is None else float(weights.sum())
        initial = self._initial_parameters(n_features)
        estimator = mixture_estimator(
            self.covariance_type, self.n_components, n_features, self.reg_covar, self._e_step_dtype(data)
        )
        enc = data if is_handle(data) else seq_encode(data, estimator=estimator, device=self.device)
        if weights is not None:
            enc = with_weights(cast(PointEncoding, enc), weights)  # an array X: our Gaussian encoding
        warm = self.warm_start and hasattr(self, "converged_")
        rng = start_generator(self.random_state)
        best = None
        for start in range(1 if warm else self.n_init):
            if warm:  # scikit-learn's warm start: the first gain is against the last fit's bound
                previous = self.lower_bound_ * getattr(self, "_weight_total", count)
                result = self._em(enc, estimator, self._model(), count, start, previous)
            else:
                result = self._em(enc, estimator, self._start(enc, estimator, rng, initial), count, start)
            if best is None or result.log_density > best.log_density or best.log_density == -np.inf:
                best = result
        self._set_fitted(cast(inference.FitResult, best), count, _array_dtype(data))  # n_init >= 1: a start ran
        self._warn_unless_converged()
        return self

    def partial_fit(self, X: Any, y: ArrayLike | None = None, sample_weight: ArrayLike | None = None) -> Self:
        """Fold one chunk of rows into the fit: one step of stepwise EM (online EM).

        The running sufficient statistics move towards the chunk's, taken under the current
        model, by a step ``η_t = (t + 2)^-0.3`` (``t`` chunks folded before; Cappé and Moulines,
        Liang and Klein), and the model is their M-step: see :mod:`mixle_nb.mixture.stepwise`,
        which says why stepwise rather than incremental EM. The first call starts from its
        chunk (the start of ``init_params`` and any ``*_init`` on it), or from the fitted
        parameters after :meth:`fit`; :meth:`fit` starts afresh. Passes over the chunks of a
        dataset reach its batch fit. ``n_iter_`` counts the chunks folded, ``lower_bound_``
        is the last chunk's mean log-density under the model it was folded under (and
        ``lower_bounds_`` every chunk's); ``converged_`` stays ``False``. As in :meth:`fit`,
        a float32 chunk is folded with the float32 E-step unless ``dtype`` says otherwise,
        and the fitted attributes take the chunk's dtype.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features), handle or cluster reference
            One chunk of rows (at least ``n_components`` in the first); or a handle holding
            every rank's rows of the chunk (a ``TorchRunEncodedData`` built for this chunk,
            e.g. ``from_npy`` of the chunk's file, and ``partial_fit`` called on every rank),
            whose statistics are folded across the ranks; or ``mixle.handle(name)``, a
            reference to such a handle on the cluster's ranks. The lower bound of a handle's
            chunk takes a second pass.
        y : None
            Ignored (scikit-learn's signature).
        sample_weight : array-like of shape (n_samples,), optional
            A non-negative weight per row of an array (see :meth:`fit`; on ranks, weighted
            rows: :meth:`weighted_rows_encoder`).

        Returns
        -------
        GaussianMixture
            ``self``, updated.

        Raises
        ------
        ValueError
            On a bad parameter, chunk or ``sample_weight``, and on a chunk whose number of
            features differs from the first's (scikit-learn's messages), before any work.

        Examples
        --------
        >>> import numpy as np
        >>> from mixle_nb.mixture import GaussianMixture
        >>> rng = np.random.default_rng(0)
        >>> x = np.concatenate([rng.normal(0, 1, (500, 1)), rng.normal(8, 1, (500, 1))])
        >>> rng.shuffle(x)
        >>> gm = GaussianMixture(2, random_state=0)
        >>> for chunk in np.array_split(x, 10):
        ...     gm = gm.partial_fit(chunk)
        >>> np.round(np.sort(gm.means_.ravel()))
        array([0., 8.])
        """
        scikit_internals.validate_params(self)
        if sample_weight is not None and (is_reference(X) or is_handle(X)):
            raise ValueError(SAMPLE_WEIGHT_ON_RANKS)
        if is_reference(X):
            self.__dict__.update(X.call_with_handle(_on_rank, self, "partial_fit"))
            return self
        running = getattr(self, "_stepwise", None)
        fitted = hasattr(self, "converged_")
        enc, estimator, n_features, input_dtype = self._chunk(X, fitted, sample_weight)
        if running is not None:  # the last fold's model, in float64: float32 attributes are rounded
            model = estimator.estimate(1.0, running[0])
        elif fitted:
            model = self._model()
        else:
            initial = self._initial_parameters(n_features)
            model = self._start(enc, estimator, start_generator(self.random_state), initial)
        step = 0 if running is None else running[1]
        try:
            new, value, weight, log_density = stepwise_update(
                enc, estimator, model, None if running is None else running[0], step
            )
        except DegenerateComponentError as error:
            raise ValueError(f"{ILL_DEFINED} ({error}.)") from error
        bounds = [*self.lower_bounds_] if running is not None else []
        self._set_fitted(inference.FitResult(new, log_density, [], False, step + 1, "model"), weight, input_dtype)
        self.lower_bounds_ = [*bounds, self.lower_bound_]
        self._stepwise = (value, step + 1)
        return self

    def _chunk(self, X: Any, fitted: bool, sample_weight: ArrayLike | None) -> tuple[Any, MixtureEstimator, int, type]:
        """``(encoding or handle, estimator, n_features, dtype)`` of a ``partial_fit`` chunk,
        checked as scikit-learn checks it (the first sets ``n_features_in_``, the rest must
        match). ``dtype`` is the array's (float32 or float64); the estimator's E-step is
        ``dtype=``'s, else the array's (a handle's: ``dtype=``'s, else float64, its encoding
        its own)."""
        input_dtype: type = np.float64
        if is_handle(X):
            count, n_features = len(X), _handle_features(X)
            if fitted and n_features != self.n_features_in_:
                raise ValueError(
                    f"X has {n_features} features, but GaussianMixture is expecting "
                    f"{self.n_features_in_} features as input."
                )
            self.n_features_in_ = n_features
            checked_total_weight(X)
            enc: Any = X
            estimator = self.mixture_estimator(n_features)
        else:
            X = validate_data(self, X, dtype=[np.float64, np.float32], reset=not fitted)
            input_dtype, X = _array_dtype(X), np.asarray(X, dtype=np.float64)
            count, n_features = X.shape
            e_step = self.dtype if self.dtype is not None else input_dtype
            estimator = mixture_estimator(self.covariance_type, self.n_components, n_features, self.reg_covar, e_step)
            enc = seq_encode(X, estimator=estimator, device=self.device)
            if sample_weight is not None:
                enc = with_weights(cast(PointEncoding, enc), checked_sample_weight(sample_weight, count))
        if not fitted and count < self.n_components:
            raise ValueError(
                f"Expected n_samples >= n_components but got n_components = {self.n_components}, n_samples = {count}"
            )
        return enc, estimator, n_features, input_dtype

    def _warn_unless_converged(self) -> None:
        if not self.converged_ and self.max_iter > 0:
            warnings.warn(
                "Best performing initialization did not converge. Try different init parameters, "
                "or increase max_iter, tol, or check for degenerate data.",
                ConvergenceWarning,
                stacklevel=3,
            )

    def fit_predict(self, X: Any, y: ArrayLike | None = None, sample_weight: ArrayLike | None = None) -> np.ndarray:
        """``fit(X, sample_weight=sample_weight).predict(X)``.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features), handle or cluster reference
            The observations (see the class docstring).
        y : None
            Ignored (scikit-learn's signature).
        sample_weight : array-like of shape (n_samples,), optional
            A non-negative weight per row (see :meth:`fit`).

        Returns
        -------
        numpy.ndarray
            Each row's most responsible component, shape ``(n_samples,)``.

        Raises
        ------
        ValueError
            As :meth:`fit` does.

        Examples
        --------
        >>> import numpy as np
        >>> from mixle_nb.mixture import GaussianMixture
        >>> x = np.array([[0.0], [0.2], [5.0], [5.2]])
        >>> labels = GaussianMixture(2, random_state=0).fit_predict(x, sample_weight=[1, 3, 1, 1])
        >>> bool(labels[0] == labels[1] and labels[1] != labels[2])
        True
        """
        return self.fit(X, sample_weight=sample_weight).predict(X)

    def _fit_data(self, X: Any) -> tuple[Any, int, int]:
        """``(data, count, n_features)``, checked as scikit-learn does."""
        if is_handle(X):
            count, n_features = len(X), _handle_features(X)
            self.__dict__.pop("feature_names_in_", None)
            self.n_features_in_ = n_features
            if count < 2:
                raise ValueError(
                    f"Found array with {count} sample(s) while a minimum of 2 is required by GaussianMixture."
                )
            checked_total_weight(X)  # rows that all weigh 0: scikit-learn's error, before any work
        else:
            X = validate_data(self, X, dtype=[np.float64, np.float32], ensure_min_samples=2)
            count, n_features = len(X), X.shape[1]
        if count < self.n_components:
            raise ValueError(
                f"Expected n_samples >= n_components but got n_components = {self.n_components}, n_samples = {count}"
            )
        return X, count, n_features

    def _initial_parameters(self, n_features: int) -> dict:
        """The given ``*_init`` values, checked with scikit-learn's own messages."""
        k, kind = self.n_components, self.covariance_type
        given = {}
        if self.weights_init is not None:
            given["weights"] = checked_weights(self.weights_init, k)
        if self.means_init is not None:
            given["means"] = checked_means(self.means_init, k, n_features)
        if self.precisions_init is not None:
            precisions = checked_precisions(self.precisions_init, kind, k, n_features)
            given["covariances"] = covariances_from_precisions(kind, precisions)
        return given

    def _start(self, enc: Any, estimator: Estimator, rng: Any, initial: dict) -> MixtureDistribution:
        """The start: the given parameters over our start of ``init_params`` for the rest; a
        start whose M-step collapses a component raises scikit-learn's ``ValueError``."""
        if len(initial) < 3:
            try:
                started = inference.initial_model(enc, estimator, STARTS[self.init_params], rng, init_p=1.0)
            except DegenerateComponentError as error:
                raise ValueError(f"{ILL_DEFINED} (The start's {error}.)") from error
            if not initial:  # our start's model is the mixture of the estimator's own families
                return cast(MixtureDistribution, started)
            initial = {
                **dict(zip(("weights", "means", "covariances"), parameters_from_model(self.covariance_type, started))),
                **initial,
            }
        return model_from_parameters(self.covariance_type, initial["weights"], initial["means"], initial["covariances"])

    def _em(
        self,
        enc: Any,
        estimator: Estimator,
        model: Distribution,
        count: float,
        start: int,
        previous: float | None = None,
    ) -> inference.FitResult:
        """One start's EM (``previous``: the total log-density a warm start continues from)."""
        if self.verbose:
            print(f"Initialization {start}")
        if self.max_iter == 0:
            return inference.FitResult(model, -np.inf, [], False, 0, "model")
        clock = [time.perf_counter()]

        def report(record: EMStep) -> None:
            if self.verbose >= 2 and record.step % self.verbose_interval == 0:
                now = time.perf_counter()
                print(f"  Iteration {record.step}\t time lapse {now - clock[0]:.5f}s\t ll change {record.gain:.5f}")
                clock[0] = now

        # scikit-learn's stopping rule is ours: |change in the mean log-density| < tol (0: never)
        try:
            result = inference.fit(
                None,
                estimator,
                enc_data=enc,
                init=model,
                max_its=self.max_iter,
                tol=self.tol,
                out=None,
                on_step=report,
                previous_log_density=previous,
            )
        except inference.FitError as error:
            if not isinstance(error.__cause__, DegenerateComponentError):
                raise
            result = self._kept_before_collapse(enc, error, count)
        if self.verbose:
            state = "converged" if result.converged else "did not converge"
            print(f"Initialization {state}. lower bound {result.log_density / count:.5f}.")
        return result

    def _kept_before_collapse(self, enc: Any, error: inference.FitError, count: float) -> inference.FitResult:
        """The last good model of a start whose M-step collapsed a component (scikit-learn
        issue #18216): the failed iteration counts, its E-step's log-density is the bound."""
        kept = len(error.history) + 1
        warnings.warn(
            f"EM iteration {kept} collapsed a component ({error.__cause__}); keeping the model of "
            f"iteration {kept - 1}. Try to decrease the number of components, increase reg_covar, "
            "or scale the input data.",
            ConvergenceWarning,
            stacklevel=4,
        )
        _, total = seq_log_density_sum(enc, error.model)
        last = EMStep(error.model, count, float(total), step=kept)
        return inference.FitResult(error.model, float(total), [*error.history, last], False, kept, "model")

    def _e_step_dtype(self, data: Any) -> torch.dtype:
        """The E-step's dtype: ``dtype=``, else the array's own (float32 or float64)."""
        return encoding_dtype(self.dtype if self.dtype is not None else _array_dtype(data))

    def _set_fitted(self, result: inference.FitResult, count: float, dtype: type = np.float64) -> None:
        """The fitted attributes from ``result``, in ``dtype`` (the input array's, as scikit-learn's);
        the bounds are per unit of weight (the steps' own count: on a handle of weighted rows,
        the ranks' total weight)."""
        count = result.history[-1].count if result.history else count
        self._weight_total = count
        kind = self.covariance_type
        self.weights_, self.means_, self.covariances_ = parameters_from_model(kind, result.model)
        self.precisions_cholesky_ = precisions_cholesky(
            kind, self.covariances_, cast(MixtureDistribution, result.model)
        )
        self.precisions_ = precisions_from_cholesky(kind, self.precisions_cholesky_)
        for name in ("weights_", "means_", "covariances_", "precisions_cholesky_", "precisions_"):
            setattr(self, name, getattr(self, name).astype(dtype, copy=False))
        self.converged_ = bool(result.converged)
        self.n_iter_ = int(result.n_iter)
        self.lower_bound_ = float(result.log_density / count)
        self.lower_bounds_ = [float(r.log_density / count) for r in result.history]

    def _model(self) -> MixtureDistribution:
        return model_from_parameters(self.covariance_type, self.weights_, self.means_, self.covariances_)

    # -- using a fit --------------------------------------------------------------------------

    def _scoring(self, X: Any) -> tuple[Any, MixtureDistribution, MixtureEstimator]:
        """``(data, model, estimator)`` for scoring ``X``, an array or a handle."""
        check_is_fitted(self)
        if is_handle(X):
            n_features = _handle_features(X)
            if n_features != self.n_features_in_:
                raise ValueError(
                    f"X has {n_features} features, but GaussianMixture is expecting "
                    f"{self.n_features_in_} features as input."
                )
            return X, self._model(), self.mixture_estimator(n_features)
        X = np.asarray(validate_data(self, X, dtype=[np.float64, np.float32], reset=False), dtype=np.float64)
        return X, self._model(), self.mixture_estimator(X.shape[1])

    @_answered_on_ranks
    def predict_proba(self, X: Any) -> np.ndarray:
        """``(n_samples, n_components)`` responsibilities (float32 for a float32 array)."""
        data, model, _ = self._scoring(X)
        return inference.predict_proba(data, model, gather=True).astype(_array_dtype(X), copy=False)

    @_answered_on_ranks
    def predict(self, X: Any) -> np.ndarray:
        """Each observation's most responsible component."""
        data, model, _ = self._scoring(X)
        return inference.predict(data, model, gather=True)

    @_answered_on_ranks
    def score_samples(self, X: Any) -> np.ndarray:
        """Each observation's log-density (float32 for a float32 array)."""
        data, model, _ = self._scoring(X)
        return inference.score_samples(data, model, gather=True).astype(_array_dtype(X), copy=False)

    @_answered_on_ranks
    def score(self, X: Any, y: ArrayLike | None = None) -> float:
        """The mean log-density per observation."""
        data, model, _ = self._scoring(X)
        if is_handle(data):
            count, total = seq_log_density_sum(data, model)
            return float(total / count)
        # scikit-learn's: the mean of score_samples, in the array's dtype (float32 stays float32)
        return float(inference.score_samples(data, model).astype(_array_dtype(X), copy=False).mean())

    @_answered_on_ranks
    def bic(self, X: Any) -> float:
        """Bayesian information criterion on ``X`` (lower is better)."""
        data, model, estimator = self._scoring(X)
        return float(inference.bic(data, model, estimator))

    @_answered_on_ranks
    def aic(self, X: Any) -> float:
        """Akaike information criterion on ``X`` (lower is better)."""
        data, model, estimator = self._scoring(X)
        return float(inference.aic(data, model, estimator))

    def sample(self, n_samples: int = 1) -> tuple[np.ndarray, np.ndarray]:
        """``(X, y)``: ``n_samples`` draws, grouped by component as scikit-learn's are."""
        check_is_fitted(self)
        if n_samples < 1:
            raise ValueError(f"Invalid value for 'n_samples': {n_samples} . The sampling requires at least one sample.")
        rng = check_random_state(self.random_state)
        counts = rng.multinomial(n_samples, self.weights_)
        generator = np.random.default_rng(rng.randint(2**31 - 1))
        model = self._model()
        d = self.means_.shape[1]
        x = np.concatenate([c.draw(generator, int(m)).reshape(int(m), d) for c, m in zip(model.components, counts)])
        return x, np.repeat(np.arange(self.n_components), counts)
