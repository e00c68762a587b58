"""Batch EM: :func:`fit` and :func:`optimize` from their starts (:mod:`.starts`), with
restarts, checkpoints and the one stopping rule (:func:`stopping_tolerance`); and streaming
statistics (:func:`streaming_accumulate`)."""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TextIO

from ..checkpoint import EMCheckpoint
from ..parallel.group import torchrun_out
from ..stats.base import Distribution, Estimator, random_source
from ..stats.estimation import (
    EMStep,
    accumulate,
    em_step,
    is_handle,
    seq_encode,
    tie_keys,
)
from ..validation import choice, non_negative_real, positive_int
from .starts import INITS, default_init, initial_model

#: The stopping tolerance when neither ``delta`` nor ``tol`` is given (mixle's default ``delta``):
#: EM stops once the gain in log-density per observation is smaller in magnitude.
DEFAULT_DELTA = 1e-9
#: The default ``out`` of :func:`fit` and :func:`choose_k`: progress lines go to
#: ``sys.stdout`` on the root rank only (a handle's root, or rank 0 of the group).
ROOT_STDOUT = "stdout on the root rank"
Run = tuple[Distribution, float, list[EMStep]]  # a start in progress: model, log-density, history


class FitError(RuntimeError):
    """An EM step failed; the error keeps what came before it.

    Parameters
    ----------
    message : str
        What failed, and where the last good model is.
    model : Distribution
        The last good model, in ``model``.
    history : list of EMStep
        The steps so far, in ``history``.

    Examples
    --------
    >>> import numpy as np
    >>> from mixle_nb.inference import FitError
    >>> from mixle_nb.stats import GaussianDistribution
    >>> error = FitError("EM iteration 3 failed", GaussianDistribution(0.0, 1.0), [])
    >>> error.model.mu, error.history
    (0.0, [])
    """

    def __init__(self, message: str, model: Distribution, history: list):
        super().__init__(message)
        self.model, self.history = model, history


def streaming_accumulate(enc: Any, estimator: Estimator, model: Distribution) -> tuple[float, Any]:
    """The folded, key-tied statistics of the data under ``model``, for online EM.

    For blending with older statistics. A handle's ``pysp_stream_accumulate`` returns tied values,
    as mixle's do. Finish with ``estimator.estimate(count, acc.value())``: tying again
    (``stats.m_step``) would add tied statistics twice.

    Parameters
    ----------
    enc : encoding or EncodedDataHandle
        Local encoded data or any handle.
    estimator : Estimator
        The estimator whose accumulator gathers the statistics.
    model : Distribution
        The model the E-step runs under.

    Returns
    -------
    count : float
        The number of observations.
    accumulator : Accumulator
        The statistics, folded across ranks and key-tied.

    Examples
    --------
    >>> import numpy as np
    >>> from mixle_nb.inference import streaming_accumulate
    >>> from mixle_nb.stats import GaussianDistribution, GaussianEstimator, seq_encode
    >>> estimator = GaussianEstimator()
    >>> enc = seq_encode(np.array([1.0, 2.0, 3.0]), estimator=estimator)
    >>> count, acc = streaming_accumulate(enc, estimator, GaussianDistribution(0.0, 1.0))
    >>> count, estimator.estimate(count, acc.value()).mu
    (3.0, 2.0)
    """
    if hasattr(enc, "pysp_stream_accumulate"):
        count, value = enc.pysp_stream_accumulate(estimator, model)
        folded = estimator.accumulator_factory().make()
        folded.from_value(value)
        return count, folded
    acc = accumulate([enc], estimator, model)
    return acc.count, tie_keys(acc.accumulator)


@dataclass
class FitResult:
    """What :func:`fit` found: the best start's model and how it got there.

    Parameters
    ----------
    model : Distribution
        The fitted model of the best start.
    log_density : float
        The last iteration's log-density (that of the model that iteration started from; EM never
        makes it worse).
    history : list of EMStep
        That start's iterations.
    converged : bool
        Whether the stopping rule (see :func:`stopping_tolerance`) ended it.
    n_iter : int
        Its iterations.
    init : str
        Its start's name (``"model"`` for a start model).
    restarts : list of float, optional
        Every start's final log-density, the best of which this result is.

    Examples
    --------
    >>> import numpy as np
    >>> from mixle_nb.inference import fit
    >>> from mixle_nb.stats import GaussianEstimator, MixtureEstimator
    >>> rng = np.random.default_rng(0)
    >>> x = np.concatenate([rng.normal(-3, 1, 200), rng.normal(3, 1, 200)])
    >>> result = fit(x, MixtureEstimator([GaussianEstimator()] * 2), n_init=2, rng=0, out=None)
    >>> result.converged, result.init, len(result.restarts)
    (True, 'kmeans++', 2)
    >>> result.log_density == max(result.restarts)
    True
    """

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
    delta: float | None = DEFAULT_DELTA,
    tol: float | None = None,
    init_p: float = 0.1,
    rng: Any = None,
    out: TextIO | str | None = ROOT_STDOUT,
    on_step: Callable[[EMStep], None] | None = None,
    device: Any = None,
    checkpoint: str | os.PathLike | EMCheckpoint | None = None,
    previous_log_density: float | None = None,
) -> FitResult:
    """EM from ``n_init`` starts, keeping the one with the best final log-density.

    Ctrl-C returns the best start so far (the interrupted one with its last good model).

    Parameters
    ----------
    data : array-like, EncodedDataHandle or None
        Raw observations, or any handle (``fit(h, est)``).
    estimator : Estimator
        The family to fit (ours or mixle's).
    enc_data : encoding or EncodedDataHandle, optional
        Local encoded data or any handle, instead of ``data`` (which is then not encoded).
    init : str or Distribution, optional
        A start name (see :func:`initial_model`; ``None`` picks :func:`default_init`) or a model.
    n_init : int, default 1
        Starts to run (more than one needs a start name).
    max_its : int, default 100
        Iterations per start at most.
    delta, tol : float or None
        The tolerance of the one stopping rule (see :func:`stopping_tolerance`): a start stops
        when its gain in log-density per observation is smaller in magnitude; ``None`` or ``0``
        runs exactly ``max_its`` iterations.
    init_p : float, default 0.1
        The fraction of observations a ``"random"`` start draws.
    rng : None, int, numpy.random.Generator or numpy.random.RandomState
        The random source of the starts.
    out : text stream, None or ROOT_STDOUT
        Where one line per iteration goes (``None`` silences it); the default is
        ``sys.stdout`` on the root rank only (a handle's root or, for local data under
        torch.distributed, rank 0, as ``torchrun_out``); ``out=sys.stdout`` prints on every rank.
    on_step : callable, optional
        Called with every :class:`~mixle_nb.stats.EMStep`.
    device : str or torch.device, optional
        Where ``data`` are encoded and every E-step kernel runs (``None``: the CPU); the
        M-step stays on the host.
    checkpoint : path or EMCheckpoint, optional
        Save the run atomically every step (or every ``EMCheckpoint.every``); if the file
        exists, continue from it, step for step the run it saved.
    previous_log_density : float, optional
        Continue a run that ended at ``init`` (a model): its last ``FitResult.log_density``
        over the same data. The first iteration's gain is taken against it, so a run that had
        converged stops after one iteration (scikit-learn's ``warm_start``); ``None``: against
        ``-inf``, so the first iteration never stops a run.

    Returns
    -------
    FitResult
        The best start's model, log-density, history and every start's final log-density.

    Raises
    ------
    ValueError
        On a bad argument, before any step (see the messages).
    FitError
        If an EM step fails; it carries the last good model and the history.

    See Also
    --------
    optimize : The same, returning only the model.
    choose_k : Fits for several numbers of components.
    mixle_nb.widgets.EMPanel : Stepping EM interactively.

    Examples
    --------
    >>> import numpy as np
    >>> from mixle_nb.inference import fit
    >>> from mixle_nb.stats import GaussianEstimator, MixtureEstimator
    >>> rng = np.random.default_rng(0)
    >>> x = np.concatenate([rng.normal(-3, 1, 200), rng.normal(3, 1, 200)])
    >>> result = fit(x, MixtureEstimator([GaussianEstimator()] * 2), init="kmeans++", rng=0, out=None)
    >>> result.converged
    True
    >>> sorted(round(c.mu, 1) for c in result.model.components)
    [-3.0, 2.9]

    On a handle (``fit(h, estimator)``) every rank runs the same call and gets the same result.
    """
    max_its = positive_int("max_its", max_its)
    n_init = positive_int("n_init", n_init)
    tolerance = stopping_tolerance(delta, tol)
    start_model = None if init is None or isinstance(init, str) else init
    name = "model" if start_model is not None else choice("init", init or default_init(estimator), INITS)
    if start_model is not None and n_init > 1:
        raise ValueError(
            "n_init > 1 needs a start name (init='kmeans++', ...), not a model: "
            "every restart would start from the same model"
        )
    if previous_log_density is not None and start_model is None:
        raise ValueError("previous_log_density continues a run from its model: pass init=<that model>")
    if is_handle(data):
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
    saved = EMCheckpoint.of(checkpoint)
    if start_model is None or saved is not None:  # a start to draw, or a checkpoint that records the source
        rng = random_source(rng)
    resumed = saved.resume_fit(n_init, name, rng) if saved else None
    best: FitResult | None = resumed["best"] if resumed else None
    finals = resumed["finals"] if resumed else []
    for start in range(resumed["start"] if resumed else 0, n_init):
        begun = resumed["run"] if resumed and start == resumed["start"] else None
        if begun is None and previous_log_density is not None and start_model is not None:
            begun = (start_model, float(previous_log_density), [])
        model = (
            begun[0]
            if begun
            else initial_model(enc_data, estimator, start_model if start_model is not None else name, rng, init_p)
        )
        if n_init > 1:
            _say(out, f"Start {start + 1} of {n_init} ({name})")

        def save(step: int, run: Run, start: int = start, best: FitResult | None = best) -> None:
            if saved is not None and saved.due(step):
                saved.save_fit(n_init, name, rng, start, best, finals, run)

        result, interrupted = _em(
            enc_data, estimator, model, max_its, tolerance, out, on_step, start, begun, save if saved else None
        )
        result.init = name
        finals.append(result.log_density)
        if best is None or result.log_density > best.log_density:
            best = result
        if interrupted:
            break
        if saved:
            saved.save_fit(n_init, name, rng, start + 1, best, finals)
    assert best is not None  # n_init >= 1 starts ran, or the checkpoint held the best
    best.restarts = finals
    return best


def optimize(
    data: Any, estimator: Estimator, *, prev_estimate: Distribution | None = None, **fit_options: Any
) -> Distribution:
    """:func:`fit`, returning only the model (as mixle's ``optimize`` does).

    Every keyword of :func:`fit` passes through with its meaning and default (``delta`` and
    ``tol``: the one stopping rule, :func:`stopping_tolerance`; ``checkpoint``: save every
    step, continue from the file), so none can be dropped on the way.

    Parameters
    ----------
    data, estimator : object
        As in :func:`fit`.
    prev_estimate : Distribution, optional
        The start model: the same as ``init=<model>``.
    **fit_options
        Any keyword of :func:`fit` (``enc_data``, ``init``, ``n_init``, ``max_its``,
        ``delta``, ``tol``, ``init_p``, ``rng``, ``out``, ``on_step``, ``device``, ``checkpoint``,
        ``previous_log_density``).

    Returns
    -------
    Distribution
        The fitted model of the best start.

    Raises
    ------
    TypeError
        If a keyword is not one of :func:`fit`'s.
    ValueError
        If both ``prev_estimate`` and ``init`` are given, or :func:`fit` refuses an argument.
    FitError
        If an EM step fails (it carries the last good model).

    Examples
    --------
    >>> import numpy as np
    >>> from mixle_nb.inference import optimize
    >>> from mixle_nb.stats import GaussianDistribution, GaussianEstimator, MixtureDistribution, MixtureEstimator
    >>> rng = np.random.default_rng(0)
    >>> x = np.concatenate([rng.normal(-3, 1, 200), rng.normal(3, 1, 200)])
    >>> start = MixtureDistribution([GaussianDistribution(-1.0, 1.0), GaussianDistribution(1.0, 1.0)], [0.5, 0.5])
    >>> model = optimize(x, MixtureEstimator([GaussianEstimator()] * 2), prev_estimate=start, out=None)
    >>> [round(c.mu, 1) for c in model.components]
    [-3.0, 2.9]
    """
    if prev_estimate is not None:
        if fit_options.get("init") is not None:
            raise ValueError("pass prev_estimate or init, not both (prev_estimate is init=<model>)")
        fit_options["init"] = prev_estimate
    return fit(data, estimator, **fit_options).model


def _em(
    enc: Any,
    estimator: Estimator,
    model: Distribution,
    max_its: int,
    tolerance: float | None,
    out: TextIO | None,
    on_step: Callable[[EMStep], None] | None,
    start: int,
    begun: Run | None = None,
    save: Callable[[int, Run], None] | None = None,
) -> tuple[FitResult, bool]:
    """One start's EM loop, continuing ``begun`` (model, previous, history) if given, and
    ``save(iteration, run)`` after each iteration; returns its result and whether Ctrl-C ended it."""
    history: list[EMStep] = list(begun[2]) if begun else []
    previous = begun[1] if begun else -math.inf
    if history and _converged(history[-1].gain, tolerance):
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
        if _converged(gain, tolerance):
            return FitResult(model, previous, history, True, iteration, ""), False
    return FitResult(model, previous, history, False, max_its, ""), False


def stopping_tolerance(delta: float | None, tol: float | None) -> float | None:
    """The tolerance of EM's one stopping rule, from mixle's and scikit-learn's names for it.

    A start stops at the first iteration whose gain in log-density per observation has a
    magnitude below the tolerance (scikit-learn's rule: a fall, which EM makes only by rounding,
    counts by its size, so a real fall is never taken for convergence). The gain is per
    observation, so one tolerance suits any data size (mixle's own loop compares the total). ``tol`` (scikit-learn's
    name) is the tolerance when given; otherwise ``delta`` (mixle's name, default
    :data:`DEFAULT_DELTA`) is. ``None`` or ``0`` never stops early: exactly ``max_its``
    iterations, as mixle's ``delta=None`` and scikit-learn's ``tol=0``.

    Parameters
    ----------
    delta : float or None
        mixle's name for the tolerance, used when ``tol`` is ``None``.
    tol : float or None
        scikit-learn's name for the tolerance.

    Returns
    -------
    float or None
        The tolerance; ``None`` when there is none.

    Raises
    ------
    ValueError
        If either is negative or not a finite real, or both are given as different
        tolerances (``delta`` other than its default, ``0`` or ``None``, beside a different
        ``tol``): one rule has one tolerance.

    Examples
    --------
    >>> from mixle_nb.inference import stopping_tolerance
    >>> stopping_tolerance(delta=1e-9, tol=None)
    1e-09
    >>> stopping_tolerance(delta=1e-9, tol=1e-3)  # delta at its default: tol wins
    0.001
    >>> stopping_tolerance(delta=None, tol=None) is None  # exactly max_its iterations
    True
    >>> stopping_tolerance(delta=1e-6, tol=1e-3)
    Traceback (most recent call last):
    ...
    ValueError: delta=1e-06 and tol=0.001 name one tolerance (EM's one stopping rule): pass one of them
    """
    delta = None if delta is None else non_negative_real("delta", delta)
    if tol is None:
        return delta
    tol = non_negative_real("tol", tol)
    if delta not in (None, 0.0, DEFAULT_DELTA, tol):
        raise ValueError(
            f"delta={delta!r} and tol={tol!r} name one tolerance (EM's one stopping rule): pass one of them"
        )
    return tol


def _converged(gain: float, tolerance: float | None) -> bool:
    """The stopping rule: the gain per observation smaller in magnitude than ``tolerance``."""
    return tolerance is not None and abs(gain) < tolerance


def _output(out: TextIO | str | None, data: Any) -> TextIO | None:
    """Where progress lines go: ``out``, with :data:`ROOT_STDOUT` resolved to ``sys.stdout``
    on the root rank (a handle's root; for local data, rank 0 of the group, see
    ``torchrun_out``) and to nothing on the others."""
    if not isinstance(out, str):
        return out
    if out != ROOT_STDOUT:
        raise ValueError(f"out must be a text stream, None or ROOT_STDOUT; got {out!r}")
    if is_handle(data):
        return sys.stdout if getattr(data, "rank", 0) == getattr(data, "root", 0) else None
    return torchrun_out()


def _say(out: TextIO | None, line: str) -> None:
    if out is not None:
        print(line, file=out)
