"""Drivers over the ``seq_*`` dispatch: batch EM (:func:`optimize`) and streaming statistics."""
from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from typing import Any, Callable, Optional, TextIO

from .stats.base import Distribution, Estimator, as_generator
from .stats.estimation import EMStep, accumulate, em_step, seq_encode, seq_initialize


class FitError(RuntimeError):
    """An EM step failed; ``model`` is the last good model and ``history`` the steps so far."""

    def __init__(self, message: str, model: Distribution, history: list):
        super().__init__(message)
        self.model, self.history = model, history


@dataclass
class IterationRecord:
    """What ``optimize`` reports per iteration: ``log_density`` is that of the model the
    iteration started from; ``model`` is the model it produced."""

    iteration: int
    model: Distribution
    log_density: float
    gain: float


def streaming_accumulate(enc: Any, estimator: Estimator, model: Distribution) -> tuple[float, Any]:
    """``(count, accumulator)`` of the data under ``model``, folded but not yet key-tied, for
    blending with older statistics (online EM). Finish with ``stats.m_step``."""
    if hasattr(enc, "pysp_stream_accumulate"):
        return enc.pysp_stream_accumulate(estimator, model)
    acc = accumulate([enc], estimator, model)
    return acc.count, acc.accumulator


def optimize(
    data: Any,
    estimator: Estimator,
    *,
    enc_data: Any = None,
    prev_estimate: Optional[Distribution] = None,
    max_its: int = 100,
    delta: float = 1e-9,
    init_p: float = 0.1,
    rng: Any = None,
    out: Optional[TextIO] = sys.stdout,
    on_step: Optional[Callable[[IterationRecord], None]] = None,
) -> Distribution:
    """Run EM until the per-observation gain in log-density falls below ``delta`` or ``max_its``.

    ``enc_data`` (local encoded data or any handle) skips encoding ``data``. Without
    ``prev_estimate`` the start is ``seq_initialize(enc, estimator, rng, init_p)``. Each
    iteration is one E-step pass: it yields the next model and the previous model's
    log-density together. One line per iteration goes to ``out`` (``None`` silences it).
    Ctrl-C returns the last good model; any other failure raises :class:`FitError` carrying it.
    """
    if int(max_its) != max_its or max_its < 1:
        raise ValueError(f"max_its must be a positive integer; got {max_its!r}")
    if not delta >= 0:
        raise ValueError(f"delta must be >= 0; got {delta!r}")
    if enc_data is None:
        if data is None:
            raise ValueError("optimize needs data or enc_data")
        enc_data = seq_encode(data, model=prev_estimate, estimator=estimator)
    model = prev_estimate
    if model is None:
        model = seq_initialize(enc_data, estimator, as_generator(rng), init_p)
    history: list[IterationRecord] = []
    previous = -math.inf
    for iteration in range(1, int(max_its) + 1):
        try:
            step: EMStep = em_step(enc_data, estimator, model)
        except KeyboardInterrupt:
            _say(out, f"Interrupted in iteration {iteration}; returning the model of iteration {iteration - 1}")
            return model
        except Exception as exc:
            raise FitError(f"EM iteration {iteration} failed ({exc}); the last good model is in .model",
                           model, history) from exc
        gain = (step.log_density - previous) / max(step.count, 1.0)
        record = IterationRecord(iteration, step.model, step.log_density, gain)
        history.append(record)
        _say(out, f"Iteration {iteration}: log-density {step.log_density:.10g}, gain/obs {gain:.3g}")
        if on_step is not None:
            on_step(record)
        model, previous = step.model, step.log_density
        if gain < delta:
            break
    return model


def _say(out: Optional[TextIO], line: str) -> None:
    if out is not None:
        print(line, file=out)
