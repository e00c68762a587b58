"""``BayesianGaussianMixture`` with scikit-learn's signature, attributes, warnings and errors,
fitted by variational inference on our EM core: every iteration is one :func:`~mixle_nb.stats.em_step`
of :class:`~mixle_nb.stats.variational_gaussian.VariationalGaussianMixtureEstimator` (the
Gaussian mixture's E-step and statistics, the variational update in place of the M-step), on
an array, a handle (``TorchRunEncodedData``, called on every rank) or a reference to a handle
on the cluster's ranks (``mixle.handle("h")``)."""

from __future__ import annotations

import math
import time
import warnings
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import torch
from numpy.typing import ArrayLike
from sklearn.base import BaseEstimator, DensityMixin
from sklearn.exceptions import ConvergenceWarning
from sklearn.utils import check_random_state
from sklearn.utils.validation import check_is_fitted, validate_data

from .. import inference
from ..stats import em_step, seq_encode
from ..stats.estimation import is_handle
from ..stats.frame import PointEncoding, encoding_dtype, with_weights
from ..stats.variational_gaussian import (
    VariationalGaussianMixture,
    VariationalGaussianMixtureEstimator,
    VariationalPriors,
    gaussian_components,
)
from . import scikit_internals
from .bayesian_handles import (
    FITTED,
    check_handle_weight,
    handle_features,
    handle_start,
    on_rank,
)
from .bayesian_priors import prior_attributes
from .bayesian_starts import array_start
from .encoding_face import HandleEncoding
from .gaussian_mixture import SAMPLE_WEIGHT_ON_RANKS, _array_dtype, is_reference
from .sample_weights import checked_sample_weight
from .stepwise import stepwise_update
from .translation import precisions_from_cholesky

if TYPE_CHECKING:
    from typing_extensions import Self


class BayesianGaussianMixture(HandleEncoding, DensityMixin, BaseEstimator):
    """scikit-learn's ``sklearn.mixture.BayesianGaussianMixture``, on our EM core.

    Variational inference of a Gaussian mixture with a Dirichlet-process (stick-breaking) or
    Dirichlet prior on the weights and Gaussian-Wishart priors on the components: with more
    components than the data need, the fit leaves the extra ones with weights near 0. Each
    iteration is one E-step of the Gaussian mixture's kernel (the expected log-joint in place
    of ``log w_k + log p_k(x)``) and its statistics, folded across ranks on a handle, then the
    variational update; the lower bound comes from the same statistics.

    ``X`` is an ``(n_samples, n_features)`` array, a ``TorchRunEncodedData`` (every rank calls
    the method and gets the same answer) or a cluster reference (``mixle.handle("h")``: the
    call runs on the ranks). On an array every start is scikit-learn's own (its ``KMeans``,
    ``kmeans_plusplus`` and random draws from ``random_state``), so a fit equals
    scikit-learn's; on a handle the k-means starts are our k-means‖ and ``"random"`` our
    random responsibilities, taken where the data live. A handle holds Gaussian observations:
    build it with ``estimator=bgm.mixture_estimator(n_features)``.

    Parameters
    ----------
    n_components : int, default 1
        The most components the fit may use.
    covariance_type : {"full", "tied", "diag", "spherical"}, default "full"
        The components' covariance structure.
    tol : float, default 1e-3
        The fit stops when the lower bound changes by less than this in an iteration.
    reg_covar : float, default 1e-6
        Added to the diagonal of each component's data covariance.
    max_iter : int, default 100
        Iterations per start at most.
    n_init : int, default 1
        Starts to run; the one with the highest lower bound is kept.
    init_params : {"kmeans", "k-means++", "random", "random_from_data"}, default "kmeans"
        How the starting responsibilities are drawn.
    weight_concentration_prior_type : {"dirichlet_process", "dirichlet_distribution"}
        The prior on the weights; default ``"dirichlet_process"``.
    weight_concentration_prior : float, optional
        The concentration of the weights' prior (``None``: ``1 / n_components``).
    mean_precision_prior : float, optional
        The precision prior on the means (``None``: 1).
    mean_prior : array-like of shape (n_features,), optional
        The prior mean of the means (``None``: the data's mean).
    degrees_of_freedom_prior : float, optional
        The Wishart's degrees of freedom (``None``: ``n_features``); more than ``n_features - 1``.
    covariance_prior : float or array-like, optional
        The Wishart's scale, shaped for ``covariance_type`` (``None``: the data's covariance).
    random_state : int, RandomState or None, default None
        The random source of the starts.
    warm_start : bool, default False
        Continue from the last fit's parameters (and its lower bound).
    verbose : int, default 0
        1 prints each start, 2 also every ``verbose_interval`` iterations.
    verbose_interval : int, default 10
        Iterations between progress lines.
    device : str or torch.device, optional
        Keyword-only: where an array is encoded and the E-step runs (``None``: the CPU).
    dtype : {None, "float32", "float64"}, torch.dtype or numpy dtype, default None
        Keyword-only: the E-step's arithmetic (encoding, expected log-joints, responsibilities),
        as ``GaussianMixture``'s: ``None`` takes the input array's (float32 for a float32
        array, else float64; a handle's encoding is its own). The statistics, the entropy, the
        lower bound and the variational update stay float64, and so do the fitted parameters,
        as scikit-learn's are for a float32 array (its ``mean_prior_``, and the diagonal and
        spherical ``covariance_prior_`` taken from the data, are float32). What float32 keeps
        of the numerics guarantees is in the numerics guide.

    Attributes
    ----------
    weights_ : ndarray of shape (n_components,)
        The posterior mean of each component's weight.
    means_ : ndarray of shape (n_components, n_features)
        The posterior means of the components' means.
    covariances_ : ndarray
        The components' covariances (the Wishart scale over the degrees of freedom), in
        scikit-learn's shape for ``covariance_type``.
    precisions_, precisions_cholesky_ : ndarray
        Their inverses and the inverses' Cholesky factors.
    weight_concentration_ : tuple of two ndarrays or ndarray
        The Beta pairs of the stick-breaking posterior, or the Dirichlet's concentrations.
    mean_precision_ : ndarray of shape (n_components,)
        The precisions of the means' posteriors.
    degrees_of_freedom_ : ndarray of shape (n_components,) or float
        The Wishart posteriors' degrees of freedom (one for ``"tied"``).
    converged_ : bool
        Whether the best start met ``tol``.
    n_iter_ : int
        Iterations of the best start.
    lower_bound_ : float
        The best start's final lower bound (``-inf`` with ``max_iter=0``).
    lower_bounds_ : list of float
        The lower bound after each iteration of the best start.
    weight_concentration_prior_, mean_precision_prior_, mean_prior_, degrees_of_freedom_prior_, covariance_prior_
        The priors the fit used.
    n_features_in_ : int
        Features seen in ``fit``.
    feature_names_in_ : ndarray of str
        Their names, when ``X`` had string column names.

    Examples
    --------
    >>> import numpy as np
    >>> from mixle_nb.mixture import BayesianGaussianMixture
    >>> rng = np.random.default_rng(0)
    >>> X = np.concatenate([rng.normal(-4, 1, (100, 2)), rng.normal(4, 1, (100, 2))])
    >>> bgm = BayesianGaussianMixture(n_components=5, random_state=0).fit(X)
    >>> int(np.sum(bgm.weights_ > 0.05))
    2
    >>> bgm.predict([[-4.0, -4.0], [4.0, 4.0]]).tolist() != [0, 0]
    True

    A float32 array is fitted with the float32 E-step:

    >>> bgm32 = BayesianGaussianMixture(n_components=5, random_state=0).fit(X.astype(np.float32))
    >>> bool(np.allclose(bgm32.weights_, bgm.weights_, atol=1e-4)), bgm32.means_.dtype
    (True, dtype('float64'))
    """

    n_features_in_: int
    _parameter_constraints: dict = {
        **scikit_internals.bayesian_parameter_constraints(),
        "device": [None, str, torch.device],
        "dtype": [None, str, type, np.dtype, torch.dtype],
    }

    def __init__(
        self,
        *,
        n_components: int = 1,
        covariance_type: str = "full",
        tol: float = 1e-3,
        reg_covar: float = 1e-6,
        max_iter: int = 100,
        n_init: int = 1,
        init_params: str = "kmeans",
        weight_concentration_prior_type: str = "dirichlet_process",
        weight_concentration_prior: float | None = None,
        mean_precision_prior: float | None = None,
        mean_prior: ArrayLike | None = None,
        degrees_of_freedom_prior: float | None = None,
        covariance_prior: float | ArrayLike | None = None,
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
        self.weight_concentration_prior_type = weight_concentration_prior_type
        self.weight_concentration_prior = weight_concentration_prior
        self.mean_precision_prior = mean_precision_prior
        self.mean_prior = mean_prior
        self.degrees_of_freedom_prior = degrees_of_freedom_prior
        self.covariance_prior = covariance_prior
        self.random_state = random_state
        self.warm_start = warm_start
        self.verbose = verbose
        self.verbose_interval = verbose_interval
        self.device = device
        self.dtype = dtype

    # -- fitting ----------------------------------------------------------------------------

    def fit(self, X: Any, y: ArrayLike | None = None, sample_weight: ArrayLike | None = None) -> Self:
        """Fit the variational posterior from ``n_init`` starts; keep the best lower bound.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features), handle or cluster reference
            The observations (see the class docstring).
        y : None
            Ignored (scikit-learn's signature).
        sample_weight : array-like of shape (n_samples,), optional
            A non-negative weight per row (an array ``X`` only): a row of integer weight ``w``
            counts as ``w`` copies of it in the priors taken from the data (``mean_prior_``,
            ``covariance_prior_``), the starts (scikit-learn's ``KMeans`` and
            ``kmeans_plusplus`` with these weights, ``"random_from_data"`` drawing rows in
            proportion to them) and every variational update. ``None``: every row weighs 1.
            On ranks the weights live beside the rows instead: build the handle with
            :meth:`weighted_rows_encoder`.

        Returns
        -------
        BayesianGaussianMixture
            ``self``, fitted.

        Raises
        ------
        ValueError
            On a bad parameter, prior, ``X`` or ``sample_weight`` (scikit-learn's messages),
            before any work, or when a component's covariance is not positive definite.

        Examples
        --------
        >>> import numpy as np
        >>> from mixle_nb.mixture import BayesianGaussianMixture
        >>> x = np.array([[0.0], [0.2], [5.0], [5.2]])
        >>> bgm = BayesianGaussianMixture(n_components=2, random_state=0).fit(x, sample_weight=[1, 3, 1, 1])
        >>> bgm.mean_prior_.round(3).tolist()
        [1.8]
        """
        scikit_internals.validate_params(self)
        if sample_weight is not None and (is_reference(X) or is_handle(X)):
            raise ValueError(SAMPLE_WEIGHT_ON_RANKS)
        self.__dict__.pop("_stepwise", None)  # a fit starts afresh; partial_fit continues from it
        if is_reference(X):
            fitted = X.call_with_handle(on_rank, self, "fit")
            for name in FITTED:
                self.__dict__.pop(name, None)
            self.__dict__.update(fitted)
            self._warn_unless_converged()
            return self
        data, count, n_features, input_dtype = self._fit_data(X)
        e_step = self._e_step_dtype(input_dtype)  # a bad dtype= is refused before any work
        weights = None if sample_weight is None else checked_sample_weight(sample_weight, count)
        estimator = VariationalGaussianMixtureEstimator(
            self.n_components, n_features, self._priors(data, n_features, weights, input_dtype), e_step
        )
        enc = self._encoding(data, estimator, weights)
        warm = self.warm_start and hasattr(self, "converged_")
        rng = check_random_state(self.random_state)
        best: tuple | None = None
        for start in range(1 if warm else self.n_init):
            if self.verbose:
                print(f"Initialization {start}")
            model = self._model(estimator.priors) if warm else self._start(data, enc, estimator, rng, weights)
            run = self._iterate(enc, estimator, model, self.lower_bound_ if warm else -math.inf)
            if best is None or run[1] > best[1] or best[1] == -math.inf:
                best = run
        assert best is not None  # n_init >= 1: a start ran
        self._set_fitted(*best)
        self._warn_unless_converged()
        return self

    def fit_predict(self, X: Any, y: ArrayLike | None = None, sample_weight: ArrayLike | None = None) -> np.ndarray:
        """``fit(X, sample_weight=sample_weight).predict(X)``: the labels of a final E-step
        under the fitted posterior.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features), handle or cluster reference
            The observations.
        y : None
            Ignored.
        sample_weight : array-like of shape (n_samples,), optional
            A non-negative weight per row (see :meth:`fit`).

        Returns
        -------
        ndarray of shape (n_samples,)
            Each observation's most responsible component.

        Raises
        ------
        ValueError
            As :meth:`fit` does.

        Examples
        --------
        >>> import numpy as np
        >>> from mixle_nb.mixture import BayesianGaussianMixture
        >>> x = np.array([[0.0], [0.2], [5.0], [5.2]])
        >>> bgm = BayesianGaussianMixture(n_components=2, random_state=0)
        >>> labels = bgm.fit_predict(x, sample_weight=[1, 3, 1, 1])
        >>> bool(labels[0] == labels[1] and labels[1] != labels[2])
        True
        """
        return self.fit(X, sample_weight=sample_weight).predict(X)

    def partial_fit(self, X: Any, y: ArrayLike | None = None, sample_weight: ArrayLike | None = None) -> Self:
        """Fold one chunk of rows into the posterior: one step of stochastic variational inference.

        The running sufficient statistics (per unit of weight: the responsibilities' counts,
        sums and second moments, and their entropy) move towards the chunk's, taken under the
        current posterior, by ``GaussianMixture.partial_fit``'s step ``η_t = (t + 2)^-0.3``
        (:mod:`mixle_nb.mixture.stepwise`); the posterior is the variational update of those
        statistics scaled to the total weight of the chunks folded so far. The variational
        family is conjugate, so the update's natural parameters are linear in the statistics
        and interpolating the statistics is interpolating the natural parameters: this is
        stochastic variational inference (Hoffman et al., 2013) with the data's size taken as
        the weight seen (a stream: a chunk folded again counts again). The first call starts
        from its chunk (its priors from the chunk as :meth:`fit` takes them from ``X``, and
        the start of ``init_params``), or from the fitted posterior after :meth:`fit`;
        :meth:`fit` starts afresh. ``n_iter_`` counts the chunks folded, ``lower_bound_`` is
        the lower bound of the scaled running statistics (and ``lower_bounds_`` every
        chunk's); ``converged_`` stays ``False``.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features), handle or cluster reference
            One chunk of rows (at least ``n_components`` in the first); or a handle holding
            every rank's rows of the chunk (``partial_fit`` called on every rank), or
            ``mixle.handle(name)``, a reference to such a handle on the cluster's ranks.
        y : None
            Ignored (scikit-learn's signature).
        sample_weight : array-like of shape (n_samples,), optional
            A non-negative weight per row of an array (see :meth:`fit`).

        Returns
        -------
        BayesianGaussianMixture
            ``self``, updated.

        Raises
        ------
        ValueError
            On a bad parameter, chunk or ``sample_weight``, and on a chunk whose number of
            features differs from the first's (scikit-learn's messages), before any work.

        Examples
        --------
        >>> import numpy as np
        >>> from mixle_nb.mixture import BayesianGaussianMixture
        >>> rng = np.random.default_rng(0)
        >>> x = np.concatenate([rng.normal(0, 1, (500, 1)), rng.normal(8, 1, (500, 1))])
        >>> rng.shuffle(x)
        >>> bgm = BayesianGaussianMixture(n_components=2, random_state=0)
        >>> for chunk in np.array_split(x, 10):
        ...     bgm = bgm.partial_fit(chunk)
        >>> np.round(np.sort(bgm.means_.ravel()))
        array([0., 8.])
        """
        scikit_internals.validate_params(self)
        if sample_weight is not None and (is_reference(X) or is_handle(X)):
            raise ValueError(SAMPLE_WEIGHT_ON_RANKS)
        if is_reference(X):
            self.__dict__.update(X.call_with_handle(on_rank, self, "partial_fit"))
            return self
        running = getattr(self, "_stepwise", None)
        fitted = hasattr(self, "converged_")
        data, count, n_features, input_dtype = self._chunk(X, fitted)
        e_step = self._e_step_dtype(input_dtype)  # a bad dtype= is refused before any work
        weights = None if sample_weight is None else checked_sample_weight(sample_weight, count)
        priors = self._fitted_priors() if fitted else self._priors(data, n_features, weights, input_dtype)
        estimator = VariationalGaussianMixtureEstimator(self.n_components, n_features, priors, e_step)
        enc = self._encoding(data, estimator, weights)
        if fitted:
            model = self._model(priors)
        else:
            model = self._start(data, enc, estimator, check_random_state(self.random_state), weights)
        value, step, seen = (None, 0, 0.0) if running is None else running
        updated, value, weight, _ = stepwise_update(enc, estimator, model, value, step, weight_before=seen)
        new = cast(VariationalGaussianMixture, updated)
        seen += weight
        bounds = [*self.lower_bounds_] if running is not None else []
        self._set_fitted(new, new.lower_bound, [*bounds, new.lower_bound], False, step + 1)
        self._stepwise = (value, step + 1, seen)
        return self

    def _chunk(self, X: Any, fitted: bool) -> tuple[Any, int, int, type]:
        """``(data, count, n_features, dtype)`` of a ``partial_fit`` chunk (``dtype``: the
        array's, float32 or float64), checked as scikit-learn checks it (the first sets
        ``n_features_in_``, the rest must match)."""
        input_dtype: type = np.float64
        if is_handle(X):
            count = len(X)
            self.n_features_in_ = n_features = handle_features(X, self.n_features_in_ if fitted else None)
            check_handle_weight(X, priors_from_data=not fitted and self.covariance_prior is None)
        else:
            X = validate_data(self, X, dtype=[np.float64, np.float32], reset=not fitted)
            input_dtype, X = _array_dtype(X), np.asarray(X, dtype=np.float64)
            count, n_features = X.shape
        if not fitted and count < self.n_components:
            raise ValueError(
                f"Expected n_samples >= n_components but got n_components = {self.n_components}, n_samples = {count}"
            )
        return X, count, n_features, input_dtype

    def _encoding(self, data: Any, estimator: VariationalGaussianMixtureEstimator, weights: np.ndarray | None) -> Any:
        """A handle as it is; an array encoded, its rows carrying ``weights`` where given."""
        if is_handle(data):
            return data
        enc = seq_encode(data, estimator=estimator, device=self.device)
        return enc if weights is None else with_weights(cast(PointEncoding, enc), weights)

    def _warn_unless_converged(self) -> None:
        if not self.converged_ and self.max_iter > 0:
            warnings.warn(
                "Best performing initialization did not converge. Try different init parameters, "
                "or increase max_iter, tol, or check for degenerate data.",
                ConvergenceWarning,
                stacklevel=3,
            )

    def _fit_data(self, X: Any) -> tuple[Any, int, int, type]:
        """``(data, count, n_features, dtype)`` (``dtype``: the array's, float32 or float64),
        checked as scikit-learn does."""
        input_dtype: type = np.float64
        if is_handle(X):
            count, n_features = len(X), handle_features(X)
            self.__dict__.pop("feature_names_in_", None)
            self.n_features_in_ = n_features
            if count < 2:
                raise ValueError(
                    f"Found array with {count} sample(s) while a minimum of 2 is required by BayesianGaussianMixture."
                )
            check_handle_weight(X, priors_from_data=self.covariance_prior is None)
        else:
            X = validate_data(self, X, dtype=[np.float64, np.float32], ensure_min_samples=2)
            input_dtype, X = _array_dtype(X), np.asarray(X, np.float64)
            count, n_features = len(X), X.shape[1]
        if count < self.n_components:
            raise ValueError(
                f"Expected n_samples >= n_components but got n_components = {self.n_components}, n_samples = {count}"
            )
        return X, count, n_features, input_dtype

    def _e_step_dtype(self, input_dtype: type) -> torch.dtype:
        """The E-step's dtype: ``dtype=``, else the input array's (float32 or float64)."""
        return encoding_dtype(self.dtype if self.dtype is not None else input_dtype)

    def _priors(
        self, data: Any, n_features: int, weights: np.ndarray | None = None, input_dtype: type = np.float64
    ) -> VariationalPriors:
        """The priors of a fit on ``data``, set as the ``*_prior_`` attributes
        (``bayesian_priors.prior_attributes``; those from the data in ``input_dtype``)."""
        self.__dict__.update(prior_attributes(self, data, n_features, weights, input_dtype))
        return self._fitted_priors()

    def _fitted_priors(self) -> VariationalPriors:
        """The priors of the fitted ``*_prior_`` attributes, in float64."""
        covariance = self.covariance_prior_
        return VariationalPriors(
            self.covariance_type,
            self.weight_concentration_prior_type,
            float(self.weight_concentration_prior_),
            float(self.mean_precision_prior_),
            np.asarray(self.mean_prior_, dtype=np.float64),
            float(self.degrees_of_freedom_prior_),
            float(covariance) if np.ndim(covariance) == 0 else np.asarray(covariance, dtype=np.float64),
            float(self.reg_covar),
        )

    def _start(
        self,
        data: Any,
        enc: Any,
        estimator: VariationalGaussianMixtureEstimator,
        rng: np.random.RandomState,
        weights: np.ndarray | None = None,
    ) -> VariationalGaussianMixture:
        """The start, scikit-learn's ``_initialize`` from starting responsibilities: on an array
        scikit-learn's own draws (the rows' responsibilities times their ``weights``); on a
        handle our start's model's responsibilities."""
        if is_handle(data):
            return handle_start(enc, self.mixture_estimator(estimator.n_features), estimator, self.init_params, rng)
        return array_start(data, enc, estimator, self.init_params, rng, weights, self.device)

    def _iterate(
        self, enc: Any, estimator: VariationalGaussianMixtureEstimator, model: VariationalGaussianMixture, bound: float
    ) -> tuple[VariationalGaussianMixture, float, list[float], bool, int]:
        """One start's iterations (each one ``em_step``) with scikit-learn's stopping rule on the
        lower bound: ``(model, lower bound, lower bounds, converged, iterations)``."""
        if self.max_iter == 0:
            return model, -math.inf, [], False, 0
        bounds: list[float] = []
        clock = time.perf_counter()
        for iteration in range(1, self.max_iter + 1):
            previous = bound
            model = em_step(enc, estimator, model).model  # type: ignore[assignment]  # the estimator's model
            bound = model.lower_bound
            bounds.append(bound)
            if self.verbose >= 2 and iteration % self.verbose_interval == 0:
                now = time.perf_counter()
                print(f"  Iteration {iteration}\t time lapse {now - clock:.5f}s\t ll change {bound - previous:.5f}")
                clock = now
            if abs(bound - previous) < self.tol:
                converged = True
                break
        else:
            converged = False
        if self.verbose:
            print(f"Initialization {'converged' if converged else 'did not converge'}. lower bound {bound:.5f}.")
        return model, bound, bounds, converged, iteration

    def _set_fitted(
        self, model: VariationalGaussianMixture, bound: float, bounds: list[float], converged: bool, n_iter: int
    ) -> None:
        kind = self.covariance_type
        self.weight_concentration_ = model.weight_concentration
        self.mean_precision_ = model.mean_precision
        self.means_ = model.means
        self.degrees_of_freedom_ = model.degrees_of_freedom
        self.covariances_ = model.covariances
        self.precisions_cholesky_ = model.precisions_cholesky
        self.precisions_ = precisions_from_cholesky(kind, self.precisions_cholesky_)
        self.weights_ = model.weights()
        self.converged_ = bool(converged)
        self.n_iter_ = int(n_iter)
        self.lower_bound_ = float(bound)
        self.lower_bounds_ = [float(b) for b in bounds]

    def _model(self, priors: VariationalPriors | None = None) -> VariationalGaussianMixture:
        """The fitted posterior, as the E-step's model."""
        return VariationalGaussianMixture(
            self._fitted_priors() if priors is None else priors,
            self.weight_concentration_,
            self.mean_precision_,
            self.means_,
            self.degrees_of_freedom_,
            self.covariances_,
            self.lower_bound_,
        )

    # -- using a fit --------------------------------------------------------------------------

    def _scoring(self, X: Any) -> tuple[Any, VariationalGaussianMixture]:
        """``(data, model)`` for scoring ``X``, an array or a handle."""
        check_is_fitted(self)
        if is_handle(X):
            handle_features(X, self.n_features_in_)
            return X, self._model()
        X = np.asarray(validate_data(self, X, dtype=[np.float64, np.float32], reset=False), dtype=np.float64)
        return X, self._model()

    def predict_proba(self, X: Any) -> np.ndarray:
        """Each observation's responsibilities under the fitted posterior.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features), handle or cluster reference
            The observations.

        Returns
        -------
        ndarray of shape (n_samples, n_components)
            The responsibilities (rows sum to 1).
        """
        if is_reference(X):
            return np.asarray(X.call_with_handle(on_rank, self, "predict_proba"))
        data, model = self._scoring(X)
        return inference.predict_proba(data, model, gather=True)

    def predict(self, X: Any) -> np.ndarray:
        """Each observation's most responsible component.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features), handle or cluster reference
            The observations.

        Returns
        -------
        ndarray of shape (n_samples,)
            Component labels.
        """
        if is_reference(X):
            return np.asarray(X.call_with_handle(on_rank, self, "predict"))
        data, model = self._scoring(X)
        return inference.predict(data, model, gather=True)

    def score_samples(self, X: Any) -> np.ndarray:
        """Each observation's log of the summed expected joint (scikit-learn's ``score_samples``).

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features), handle or cluster reference
            The observations.

        Returns
        -------
        ndarray of shape (n_samples,)
            ``log Σ_k exp(E[log π_k] + E[log N(x | μ_k, Λ_k)])``.
        """
        if is_reference(X):
            return np.asarray(X.call_with_handle(on_rank, self, "score_samples"))
        data, model = self._scoring(X)
        return inference.score_samples(data, model, gather=True)

    def score(self, X: Any, y: ArrayLike | None = None) -> float:
        """The mean of :meth:`score_samples`.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features), handle or cluster reference
            The observations.
        y : None
            Ignored.

        Returns
        -------
        float
            The mean per observation.
        """
        return float(np.mean(self.score_samples(X)))

    def sample(self, n_samples: int = 1) -> tuple[np.ndarray, np.ndarray]:
        """``(X, y)``: ``n_samples`` draws from the Gaussians of ``weights_``, ``means_`` and
        ``covariances_``, grouped by component as scikit-learn's are.

        Parameters
        ----------
        n_samples : int, default 1
            How many to draw.

        Returns
        -------
        X : ndarray of shape (n_samples, n_features)
            The draws.
        y : ndarray of shape (n_samples,)
            Their components.

        Raises
        ------
        ValueError
            If ``n_samples < 1``.
        """
        check_is_fitted(self)
        if n_samples < 1:
            raise ValueError(f"Invalid value for 'n_samples': {n_samples} . The sampling requires at least one sample.")
        rng = check_random_state(self.random_state)
        counts = rng.multinomial(n_samples, self.weights_)
        generator = np.random.default_rng(rng.randint(2**31 - 1))
        components = gaussian_components(self.covariance_type, self.means_, self.covariances_)
        x = np.concatenate([c.draw(generator, int(m)).reshape(int(m), -1) for c, m in zip(components, counts)])
        return x, np.repeat(np.arange(self.n_components), counts)
