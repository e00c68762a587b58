"""Drivers over the ``seq_*`` dispatch: batch EM (:func:`fit`, :func:`optimize`) with its
starts and restarts, model choice (:func:`bic`, :func:`aic`, :func:`choose_k`), labels
(:func:`predict`, :func:`predict_proba`, :func:`score_samples`) and streaming statistics.

Each takes local data or any handle as its first argument; on a handle the work runs where the
shards live. Progress lines are printed on the root rank only (``out=ROOT_STDOUT``, the
default): a handle's root, or for local data rank 0 of the torch.distributed group (or of
torchrun's ``RANK``), so that every rank running the same cell prints once."""

from __future__ import annotations

import math
import sys
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, TextIO

import numpy as np

from .checkpoint import EMCheckpoint
from .parallel.em_handle import torchrun_out
from .stats.base import Distribution, Estimator, as_generator
from .stats.diagonal_gaussian import DiagonalGaussianEstimator
from .stats.estimation import (
    EMStep,
    accumulate,
    em_step,
    encoded_count,
    seq_encode,
    seq_initialize,
    seq_log_density_sum,
    tie_keys,
)
from .stats.kmeans import SingleProcess, kmeans_init
from .stats.mixture import MixtureEstimator
from .stats.multivariate_gaussian import MultivariateGaussianEstimator
from .stats.parameters import free_parameters
from .stats.spherical_gaussian import SphericalGaussianEstimator
from .validation import choice, non_negative_real, optional_int, positive_int

INITS = ("kmeans++", "random_from_data", "random")
ROOT_STDOUT = "stdout on the root rank"  # the default ``out``: sys.stdout, on the root rank only
GAUSSIAN_FAMILY = (DiagonalGaussianEstimator, SphericalGaussianEstimator, MultivariateGaussianEstimator)


class FitError(RuntimeError):
    """An EM step failed; ``model`` is the last good model and ``history`` the steps so far."""

    def __init__(self, message: str, model: Distribution, history: list):
        super().__init__(message)
        self.model, self.history = model, history


def streaming_accumulate(enc: Any, estimator: Estimator, model: Distribution) -> tuple[float, Any]:
    """``(count, accumulator)`` of the data under ``model``, folded and key-tied (a handle's
    ``pysp_stream_accumulate`` returns tied values, as mixle's do), for blending with older
    statistics (online EM). Finish with ``estimator.estimate(count, acc.value())``: tying again
    (``stats.m_step``) would add tied statistics twice."""
    if hasattr(enc, "pysp_stream_accumulate"):
        count, value = enc.pysp_stream_accumulate(estimator, model)
        folded = estimator.accumulator_factory().make()
        folded.from_value(value)
        return count, folded
    acc = accumulate([enc], estimator, model)
    return acc.count, tie_keys(acc.accumulator)


def default_init(estimator: Estimator) -> str:
    """``"kmeans++"`` for a mixture of Gaussian-family components, else ``"random"``."""
    if isinstance(estimator, MixtureEstimator) and all(isinstance(e, GAUSSIAN_FAMILY) for e in estimator.estimators):
        return "kmeans++"
    return "random"


def initial_model(
    enc: Any, estimator: Estimator, init: str | Distribution, rng: Any = None, init_p: float = 0.1
) -> Distribution:
    """The start of EM on local encoded data or a handle.

    ``init``: ``"kmeans++"`` (k-means‖ where the data live, a few Lloyd iterations, then the
    mixture estimated from hard labels), ``"random_from_data"`` (K observations as centres,
    then the same), ``"random"`` (``seq_initialize`` with fraction ``init_p``), or a model,
    returned as it is. A handle without the ``pysp_kmeans_init`` extension falls back to
    ``"random"`` with a warning. A mixture of more components than observations is refused."""
    _require_enough_observations(enc, estimator)
    if not isinstance(init, str):
        return init
    init = choice("init", init, INITS)
    if init == "random":
        return seq_initialize(enc, estimator, rng, init_p)
    if hasattr(enc, "pysp_kmeans_init"):
        return enc.pysp_kmeans_init(estimator, rng, init)
    if hasattr(enc, "pysp_seq_initialize"):  # a handle without the extension
        warnings.warn(
            f"{type(enc).__name__} has no pysp_kmeans_init; init={init!r} falls back to 'random'", stacklevel=3
        )
        return seq_initialize(enc, estimator, rng, init_p)
    return kmeans_init([enc], estimator, rng, SingleProcess(), init)


@dataclass
class FitResult:
    """What :func:`fit` found. ``log_density`` is the last iteration's (that of the model that
    iteration started from; EM never makes it worse), ``history`` that start's iterations,
    ``converged`` whether ``delta`` or ``tol`` stopped it before ``max_its``, and
    ``restarts`` every start's final log-density, the best of which this result is."""

    model: Distribution
    log_density: float
    history: list
    converged: bool
    n_iter: int
    init: str
    restarts: list = field(default_factory=list)


def fit(
    data: Any,
    estimator: Estimator,
    *,
    enc_data: Any = None,
    init: str | Distribution | None = None,
    n_init: int = 1,
    max_its: int = 100,
    delta: float | None = 1e-9,
    tol: float | None = None,
    init_p: float = 0.1,
    rng: Any = None,
    out: TextIO | str | None = ROOT_STDOUT,
    on_step: Callable[[EMStep], None] | None = None,
    device: Any = None,
    checkpoint: Any = None,
) -> FitResult:
    """EM from ``n_init`` starts, keeping the one with the best final log-density.

    ``init`` is a start name (see :func:`initial_model`; ``None`` picks :func:`default_init`)
    or a model. Each start runs until the gain in log-density per observation falls below
    ``delta``, or its magnitude below ``tol`` (scikit-learn's meaning), or ``max_its``
    (``delta=None`` and ``tol=None`` or ``0``: exactly ``max_its``, as scikit-learn's ``tol=0``)
    iterations. ``data`` may be raw observations or any handle (``fit(h, est)``); ``enc_data``
    (local encoded data or any handle) skips encoding ``data``;
    ``device`` (``"cpu"``, ``"cuda"``, ``"cuda:1"``, a ``torch.device``; ``None``: the CPU) is
    where ``data`` are encoded and every E-step kernel runs, the M-step staying on the host. One
    line per iteration goes to ``out`` (``None`` silences it; the default is ``sys.stdout`` on
    the root rank only, a handle's root or, for local data under torch.distributed, rank 0, as
    ``torchrun_out`` does; ``out=sys.stdout`` prints on every rank); ``on_step`` gets every
    :class:`~mixle_nb.stats.EMStep`. Ctrl-C returns the best start so far (the interrupted one
    with its last good model); any other failure raises :class:`FitError` carrying it.
    ``checkpoint`` (a path or an :class:`~mixle_nb.checkpoint.EMCheckpoint`) saves the run
    atomically every step (or every ``EMCheckpoint.every``); if the file exists, the fit
    continues from it, step for step the run it saved.
    """
    max_its = positive_int("max_its", max_its)
    n_init = positive_int("n_init", n_init)
    delta = None if delta is None else non_negative_real("delta", delta)
    tol = None if tol is None else non_negative_real("tol", tol)
    start_model = None if init is None or isinstance(init, str) else init
    name = "model" if start_model is not None else choice("init", init or default_init(estimator), INITS)
    if start_model is not None and n_init > 1:
        raise ValueError(
            "n_init > 1 needs a start name (init='kmeans++', ...), not a model: "
            "every restart would start from the same model"
        )
    if _is_handle(data):
        if enc_data is not None:
            raise ValueError("fit got a handle as data and enc_data= too: pass the handle once, fit(h, est)")
        data, enc_data = None, data
    out = _output(out, enc_data)
    if enc_data is None:
        if data is None:
            raise ValueError("fit needs data or enc_data")
        enc_data = seq_encode(data, model=start_model, estimator=estimator, device=device)
    elif device is not None:
        raise ValueError(
            "device= places the data fit encodes; enc_data is encoded already (encode it "
            "with seq_encode(data, device=...) or build the handle with device=...)"
        )
    rng = as_generator(rng)
    saved = EMCheckpoint.of(checkpoint)
    resumed = saved.resume_fit(n_init, name, rng) if saved else None
    best: FitResult | None = resumed["best"] if resumed else None
    finals = resumed["finals"] if resumed else []
    for start in range(resumed["start"] if resumed else 0, n_init):
        begun = resumed["run"] if resumed and start == resumed["start"] else None
        model = (
            begun[0]
            if begun
            else initial_model(enc_data, estimator, start_model if start_model is not None else name, rng, init_p)
        )
        if n_init > 1:
            _say(out, f"Start {start + 1} of {n_init} ({name})")
        save = saved and (
            lambda step, run, start=start, best=best: (
                saved.due(step) and saved.save_fit(n_init, name, rng, start, best, finals, run)
            )
        )
        result, interrupted = _em(enc_data, estimator, model, max_its, delta, tol, out, on_step, start, begun, save)
        result.init = name
        finals.append(result.log_density)
        if best is None or result.log_density > best.log_density:
            best = result
        if interrupted:
            break
        if saved:
            saved.save_fit(n_init, name, rng, start + 1, best, finals)
    best.restarts = finals
    return best


def optimize(
    data: Any,
    estimator: Estimator,
    *,
    enc_data: Any = None,
    prev_estimate: Distribution | None = None,
    init: str | Distribution | None = None,
    n_init: int = 1,
    max_its: int = 100,
    delta: float | None = 1e-9,
    tol: float | None = None,
    init_p: float = 0.1,
    rng: Any = None,
    out: TextIO | str | None = ROOT_STDOUT,
    on_step: Callable[[EMStep], None] | None = None,
    device: Any = None,
) -> Distribution:
    """:func:`fit`, returning only the model (as the reference's ``optimize`` does).
    ``prev_estimate`` is the same as ``init=<model>``; ``device`` as in :func:`fit`."""
    if prev_estimate is not None:
        if init is not None:
            raise ValueError("pass prev_estimate or init, not both (prev_estimate is init=<model>)")
        init = prev_estimate
    return fit(
        data,
        estimator,
        enc_data=enc_data,
        init=init,
        n_init=n_init,
        max_its=max_its,
        delta=delta,
        tol=tol,
        init_p=init_p,
        rng=rng,
        out=out,
        on_step=on_step,
        device=device,
    ).model


def _em(
    enc, estimator, model, max_its, delta, tol, out, on_step, start, begun=None, save=None
) -> tuple[FitResult, bool]:
    """One start's EM loop, continuing ``begun`` (model, previous, history) if given, and
    ``save(iteration, run)`` after each iteration; returns its result and whether Ctrl-C ended it."""
    history: list[EMStep] = list(begun[2]) if begun else []
    previous = begun[1] if begun else -math.inf
    if history and _converged(history[-1].gain, delta, tol):
        return FitResult(model, previous, history, True, len(history), ""), False  # saved as it converged
    for iteration in range(len(history) + 1, max_its + 1):
        try:
            step = em_step(enc, estimator, model)
        except KeyboardInterrupt:
            _say(out, f"Interrupted in iteration {iteration}; returning the model of iteration {iteration - 1}")
            return FitResult(model, previous, history, False, iteration - 1, ""), True
        except Exception as exc:
            raise FitError(
                f"EM iteration {iteration} failed ({exc}); the last good model is in .model", model, history
            ) from exc
        gain = (step.log_density - previous) / max(step.count, 1.0)
        step.step, step.gain, step.start = iteration, gain, start
        history.append(step)
        _say(out, f"Iteration {iteration}: log-density {step.log_density:.10g}, gain/obs {gain:.3g}")
        if on_step is not None:
            on_step(step)
        model, previous = step.model, step.log_density
        if save:
            save(iteration, (model, previous, history))
        if _converged(gain, delta, tol):
            return FitResult(model, previous, history, True, iteration, ""), False
    return FitResult(model, previous, history, False, max_its, ""), False


def _converged(gain: float, delta: float | None, tol: float | None) -> bool:
    """The stopping rule: the gain per observation below ``delta`` or its magnitude below ``tol``."""
    return (delta is not None and gain < delta) or (tol is not None and abs(gain) < tol)


def _is_handle(data: Any) -> bool:
    return hasattr(data, "pysp_seq_log_density_sum")


def _output(out: TextIO | str | None, data: Any) -> TextIO | None:
    """Where progress lines go: ``out``, with :data:`ROOT_STDOUT` resolved to ``sys.stdout``
    on the root rank (a handle's root; for local data, rank 0 of the group, see
    ``torchrun_out``) and to nothing on the others."""
    if out is not ROOT_STDOUT:
        return out
    if _is_handle(data):
        return sys.stdout if getattr(data, "rank", 0) == getattr(data, "root", 0) else None
    return torchrun_out()


def _require_enough_observations(enc: Any, estimator: Estimator) -> None:
    """Refuse, before any work, a mixture of more components than observations (scikit-learn
    does too): EM would leave components with no data, looking fitted. On a handle the count
    is the global one every rank knows, so every rank raises together, with no collective."""
    components = getattr(estimator, "estimators", None)
    if not type(estimator).__name__.endswith("MixtureEstimator") or components is None:
        return
    try:
        n = len(enc) if _is_handle(enc) else encoded_count(enc, estimator)
    except TypeError:  # a handle or an encoding that cannot count its observations
        return
    if n < len(components):
        raise ValueError(
            f"a mixture of {len(components)} components needs at least {len(components)} "
            f"observations, and the data hold {n}: use at most {n} components (e.g. "
            f"choose_k(data, ..., range(1, {n + 1}))), or fit more data"
        )


def _count_and_log_density(data_or_handle: Any, model: Distribution) -> tuple[float, float]:
    enc = data_or_handle if _is_handle(data_or_handle) else seq_encode(data_or_handle, model=model)
    return seq_log_density_sum(enc, model)


def bic(
    data_or_handle: Any, model: Distribution, estimator: Estimator | None = None, *, n_parameters: int | None = None
) -> float:
    """Bayesian information criterion ``-2 log L + p log N`` (lower is better).

    ``p`` counts the free parameters as ``estimator`` fits ``model`` (default
    ``model.estimator()``: nothing tied); pass the estimator you fitted with so that tying
    (``keys``, ``variance_key``, ``covariance_key``) is counted, or ``n_parameters`` for a
    family this package cannot count. On a handle: one log-density all-reduce."""
    p = _parameters(model, estimator, n_parameters)
    count, total = _count_and_log_density(data_or_handle, model)
    return -2.0 * total + p * math.log(count)


def aic(
    data_or_handle: Any, model: Distribution, estimator: Estimator | None = None, *, n_parameters: int | None = None
) -> float:
    """Akaike information criterion ``-2 log L + 2p`` (lower is better); see :func:`bic`."""
    p = _parameters(model, estimator, n_parameters)
    return -2.0 * _count_and_log_density(data_or_handle, model)[1] + 2.0 * p


def _parameters(model, estimator, n_parameters) -> int:
    if n_parameters is not None:
        return optional_int("n_parameters", n_parameters)
    return free_parameters(estimator if estimator is not None else model.estimator(), model)


@dataclass
class KChoice:
    """:func:`choose_k`'s answer: per K tried, the fitted result and its BIC and AIC; ``best_k``
    minimises BIC."""

    k: list
    results: list
    bic: list
    aic: list

    @property
    def best_k(self) -> int:
        return self.k[int(np.argmin(self.bic))]

    @property
    def best_model(self) -> Distribution:
        return self.results[int(np.argmin(self.bic))].model


def choose_k(
    data_or_handle: Any,
    estimator_for: Callable[[int], Estimator],
    k_values: Iterable[int],
    *,
    on_fit: Callable[[int, FitResult, float, float], None] | None = None,
    **fit_kwargs,
) -> KChoice:
    """Fit a mixture for every K in ``k_values`` (``estimator_for(K)`` builds its estimator)
    and score each with BIC and AIC. ``fit_kwargs`` go to :func:`fit` (``init``, ``n_init``,
    ``rng``, ``out``, ...); ``on_fit(k, result, bic, aic)`` is called after each K, for a
    live plot. Local data is encoded once per K; a handle is used as it is.

    ``tol`` defaults to scikit-learn's 1e-3: run to a tighter tolerance, a spare component
    can keep shrinking onto one or two observations (the likelihood grows without bound as
    its variance falls to the floor), which buys it a BIC it does not deserve."""
    fit_kwargs.setdefault("tol", 1e-3)
    out = fit_kwargs["out"] = _output(fit_kwargs.get("out", ROOT_STDOUT), data_or_handle)
    choice_ = KChoice([], [], [], [])
    for k in k_values:
        k = positive_int("K", k)
        estimator = estimator_for(k)
        _say(out, f"K = {k}")
        if _is_handle(data_or_handle):
            result = fit(None, estimator, enc_data=data_or_handle, **fit_kwargs)
        else:
            result = fit(data_or_handle, estimator, **fit_kwargs)
        scores = bic(data_or_handle, result.model, estimator), aic(data_or_handle, result.model, estimator)
        for target, value in zip((choice_.k, choice_.results, choice_.bic, choice_.aic), (k, result, *scores)):
            target.append(value)
        if on_fit is not None:
            on_fit(k, result, *scores)
    return choice_


def _per_observation(data_or_handle: Any, model: Distribution, function: Callable, gather: bool) -> np.ndarray:
    if _is_handle(data_or_handle):
        if not hasattr(data_or_handle, "pysp_shard_map"):
            raise TypeError(
                f"{type(data_or_handle).__name__} has no pysp_shard_map: it cannot score "
                "observations where they live; score the raw data instead"
            )
        explain = getattr(data_or_handle, "explain_failure", None)  # names a model of another dimension

        def scored(enc):
            try:
                return function(enc)
            except Exception as exc:
                explained = exc if explain is None else explain(exc, model)
                if explained is exc:
                    raise
                raise explained from exc

        return data_or_handle.pysp_shard_map(scored, gather=gather)
    return function(model.dist_to_encoder().seq_encode(data_or_handle))


def _posterior_of(model: Distribution) -> Callable:
    if not hasattr(model, "seq_posterior"):
        raise TypeError(
            f"predict and predict_proba need a mixture (a model with seq_posterior); got {type(model).__name__}"
        )
    return model.seq_posterior


def predict_proba(data_or_handle: Any, model: Distribution, *, gather: bool = False) -> np.ndarray:
    """``(N, K)`` component responsibilities under a mixture ``model``.

    On a handle each rank computes its own shard's rows and keeps them; ``gather=True``
    returns every observation's, in the original order, on every rank."""
    return _per_observation(data_or_handle, model, _posterior_of(model), gather)


def predict(data_or_handle: Any, model: Distribution, *, gather: bool = False) -> np.ndarray:
    """Each observation's most responsible component (see :func:`predict_proba`)."""
    posterior = _posterior_of(model)
    return _per_observation(data_or_handle, model, lambda enc: np.argmax(posterior(enc), axis=1), gather)


def score_samples(data_or_handle: Any, model: Distribution, *, gather: bool = False) -> np.ndarray:
    """Each observation's log-density under ``model`` (see :func:`predict_proba`)."""
    return _per_observation(data_or_handle, model, model.seq_log_density, gather)


def _say(out: TextIO | None, line: str) -> None:
    if out is not None:
        print(line, file=out)
