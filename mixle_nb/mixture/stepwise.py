"""Stepwise EM (Cappé and Moulines, 2009; Liang and Klein, 2009), the online EM behind
``GaussianMixture.partial_fit``.

The running statistics are per-unit-weight averages: after chunk ``t`` (counted from 0)

    s_t = (1 - η_t) s_{t-1} + η_t · (chunk t's statistics under the current model) / (its weight),

with ``η_0 = 1`` (the first chunk alone) and ``η_t = (t + 2)^-α`` after, ``α = STEP_EXPONENT``;
the model is the M-step of ``s_t``. Since ``η_t → 0`` the noise of single chunks averages
away. The exponent is 0.3, below the ``0.5 < α ≤ 1`` of the stochastic-approximation proofs,
because EM's own slow progress, not noise, dominates a few passes: three passes of 40 chunks
(N = 2e5, D = 4, K = 5, overlapping clusters batch EM needs 29 iterations for) ended below
the batch fit's mean log-likelihood by 7.0e-3 with α = 0.6, 3.3e-3 with 0.5, 1.1e-3 with 0.4
and 7.6e-4 with 0.3 (measured; the batch fit continued from there gained 4e-7, i.e. the same optimum).

Why stepwise and not incremental EM (Neal and Hinton, 1998, which keeps every chunk's last
statistics and replaces them): ``partial_fit`` is told nothing of which chunk it gets, nor how
many there are, so it cannot know which statistics to replace; stepwise EM needs only the one
running sum, whatever the chunks.

Statistics about different reference points (the Gaussians centre their sums on the model's
means: :mod:`mixle_nb.stats.centred_moments`) are blended with the accumulators' own
``combine``, which moves one to the other's reference; scaling a value scales its sums.
"""

from __future__ import annotations

import math
from typing import Any

from ..inference import streaming_accumulate
from ..stats.base import Distribution, Estimator
from ..stats.estimation import accumulate, is_handle, tie_keys
from ..stats.values import flatten_value, unflatten_value, value_layout
from .handle_weights import weighted_log_density_sum

STEP_EXPONENT = 0.3


def step_size(step: int) -> float:
    """``η_t``: 1 for the first chunk (``step`` 0), then ``(step + 2)^-α``."""
    return 1.0 if step == 0 else float((step + 2) ** -STEP_EXPONENT)


def scaled(value: Any, factor: float) -> Any:
    """An accumulator value with every number multiplied by ``factor`` (all are sums)."""
    layout = value_layout(value)
    if layout is None:
        raise TypeError("stepwise EM needs statistics of numbers (a Gaussian mixture's)")
    return unflatten_value(flatten_value(value) * factor, layout)


def stepwise_update(
    enc: Any, estimator: Estimator, model: Distribution, running: Any, step: int, weight_before: float | None = None
) -> tuple[Distribution, Any, float, float]:
    """Fold one chunk into the running statistics: local encoded rows, or a handle (every
    rank's rows of the chunk, folded across the ranks; called on every rank).

    Returns ``(model, running, weight, log_density)``: the M-step of the new running
    statistics, those statistics, the chunk's weight and its total log-density under
    ``model`` (the model it was folded under, each row's weighted by the row's sample weight;
    on a handle a second pass).
    ``weight_before`` is for an M-step that is not scale-free (the variational update): the
    weight of the chunks folded before, so the model is the M-step of the running statistics
    scaled to all the weight folded; a handle's log-density is then not taken (NaN)."""
    if is_handle(enc):
        weight, folded = streaming_accumulate(enc, estimator, model)
        log_density = math.nan if weight_before is not None else weighted_log_density_sum(enc, model)
    else:
        summed = accumulate([enc], estimator, model)
        weight, folded, log_density = summed.count, tie_keys(summed.accumulator), summed.log_density
    chunk = scaled(folded.value(), 1.0 / weight)
    rate = step_size(step)
    acc = estimator.accumulator_factory().make()
    if running is None or rate == 1.0:
        acc.from_value(chunk)
    else:
        acc.from_value(scaled(running, 1.0 - rate))
        acc.combine(scaled(chunk, rate))
    value = acc.value()
    if weight_before is None:
        return estimator.estimate(1.0, value), value, weight, log_density
    total_weight = weight_before + weight
    return estimator.estimate(total_weight, scaled(value, total_weight)), value, weight, log_density
