"""The reference the local EM steps' tests compare against (``tests/test_fused_step.py``,
``test_tied_step.py``, ``test_diagonal_step.py``): the general step, accumulator by accumulator."""

from __future__ import annotations

import pytest

from mixle_nb.stats import DegenerateComponentError, accumulate, m_step


def general_step(enc, estimator, model):
    """``(new model, count, log-density of model)`` by the general (torch, accumulator) step."""
    acc = accumulate([enc], estimator, model)
    return m_step(estimator, acc.count, acc.accumulator), acc.count, acc.log_density


def assert_raises_as_the_general_step(step, enc, estimator, model) -> None:
    """``step`` raises the general step's ``DegenerateComponentError``, with its message."""
    with pytest.raises(DegenerateComponentError) as taken:
        step(enc, estimator, model)
    with pytest.raises(DegenerateComponentError) as general:
        general_step(enc, estimator, model)
    assert str(taken.value) == str(general.value)
