"""The reference the local EM steps' tests compare against (``tests/test_fused_step.py``,
``test_tied_step.py``, ``test_diagonal_step.py``): the general step, accumulator by accumulator."""

from __future__ import annotations

from mixle_nb.stats import accumulate, m_step


def general_step(enc, estimator, model):
    """``(new model, count, log-density of model)`` by the general (torch, accumulator) step."""
    acc = accumulate([enc], estimator, model)
    return m_step(estimator, acc.count, acc.accumulator), acc.count, acc.log_density
