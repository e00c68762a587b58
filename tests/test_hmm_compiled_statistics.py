"""The compiled scaled pass that makes the emission terms and the M-step statistics inside the
pass (mixle_nb.stats.hmm.scaled_kernel): its E-step equals the route through stored posteriors
(the forward–backward's gamma handed to the emission accumulators) and the log-space pass."""

from __future__ import annotations

import numpy as np
import pytest

from mixle_nb.stats import (
    CategoricalDistribution,
    DiagonalGaussianDistribution,
    GaussianDistribution,
    MultivariateGaussianEstimator,
    SphericalGaussianDistribution,
    seq_encode,
)
from mixle_nb.stats.hmm import HiddenMarkovDistribution, HiddenMarkovEstimator, scaled_kernel
from mixle_nb.stats.hmm.emissions import compiled_source, compiled_statistics

STARTPROB = [0.5, 0.3, 0.2]
TRANSMAT = [[0.8, 0.15, 0.05], [0.1, 0.7, 0.2], [0.25, 0.25, 0.5]]


def _states(family, rng):
    """Three states of ``family`` and a draw of observations for them."""
    if family == "gaussian":
        return [GaussianDistribution(m, v) for m, v in [(1e3, 1.0), (1e3 + 3.0, 0.5), (1e3 - 2.0, 2.0)]], (
            lambda n: 1e3 + rng.normal(0, 3, n)
        )
    if family == "diagonal":
        return [DiagonalGaussianDistribution([m, -m], [1.0, 1.0 + m * m]) for m in (0.0, 2.0, -1.5)], (
            lambda n: rng.normal(0, 2, (n, 2))
        )
    if family == "spherical":
        return [SphericalGaussianDistribution([m, 1.0], 1.0 + m * m) for m in (0.0, 2.0, -1.5)], (
            lambda n: rng.normal(0, 2, (n, 2))
        )
    # a label the third state cannot emit
    probabilities = [*rng.dirichlet(np.ones(4), 2), [0.5, 0.5, 0.0, 0.0]]
    return [CategoricalDistribution(dict(zip("abcd", p))) for p in probabilities], (
        lambda n: rng.choice(list("abcd"), n)
    )


def _e_step(model, enc, weights, compiled_route):
    """The accumulator's value after one E-step, through the compiled route or around it."""
    acc = model.estimator().make_accumulator()
    if not compiled_route:
        acc._compiled_batch = lambda batch, w, m: None  # the stored-posteriors route instead
    log_likelihood = acc.seq_update(enc, weights, model)
    return np.asarray(log_likelihood), acc.value()


def _assert_values_equal(ours, reference, rtol):
    """Start, transition and occupancy counts and each state's emission statistics."""
    for a, b in zip(ours[:3], reference[:3]):
        np.testing.assert_allclose(a, b, rtol=rtol, atol=1e-12)
    for a, b in zip(ours[3], reference[3]):
        if isinstance(a, dict):
            assert a.keys() == b.keys()
            np.testing.assert_allclose([a[key] for key in b], list(b.values()), rtol=rtol, atol=1e-12)
        else:
            np.testing.assert_allclose(a, b, rtol=rtol, atol=1e-9)


@pytest.mark.parametrize("family", ["gaussian", "diagonal", "spherical", "categorical"])
def test_compiled_e_step_equals_the_stored_posteriors_route(family):
    """Ragged sequences (lengths 1 to 6) over two full tiles and a rest, with sequence weights:
    the log-likelihoods and every statistic of the E-step whose pass makes the emission terms
    and adds the statistics itself equal those of the pass that stores the posteriors and hands
    them to the accumulators (within 1e-12), and of the log-space pass (within 1e-9)."""
    rng = np.random.default_rng(17)
    emissions, draw = _states(family, rng)
    seqs = [draw(int(n)) for n in rng.integers(1, 7, 2 * scaled_kernel.TILE + 37)]
    weights = rng.uniform(0.1, 2.0, len(seqs))
    model = HiddenMarkovDistribution(emissions, STARTPROB, TRANSMAT, "scaling")
    enc = seq_encode(seqs, model=model)
    batch = enc.batches[0]
    source = compiled_source(model.emissions, batch.emissions)
    assert source is not None
    accumulators = model.estimator().make_accumulator().accumulators
    assert compiled_statistics(accumulators, *source, batch.emissions) is not None
    ll, ours = _e_step(model, enc, weights, compiled_route=True)
    ll_stored, stored = _e_step(model, enc, weights, compiled_route=False)
    np.testing.assert_allclose(ll, ll_stored, rtol=1e-12)
    _assert_values_equal(ours, stored, rtol=1e-12)
    log_model = HiddenMarkovDistribution(emissions, STARTPROB, TRANSMAT, "log")
    ll_log, in_logs = _e_step(log_model, enc, weights, compiled_route=True)
    np.testing.assert_allclose(ll, ll_log, rtol=1e-10)
    _assert_values_equal(ours, in_logs, rtol=1e-9)


def test_compiled_e_step_far_from_every_state():
    """Observations 1e4 standard deviations from every state (each emission underflows) and
    transitions of 1e-90: the compiled E-step stays finite and equals the log-space pass."""
    eps = 1e-90
    emissions = [GaussianDistribution(0.0, 1.0), GaussianDistribution(100.0, 1.0)]
    seqs = [np.tile([0.0, 100.0], 20), np.tile([100.0, 0.0, 0.0], 9), np.array([1e4, -1e4, 5e3])]
    values = []
    for implementation in ("scaling", "log"):
        model = HiddenMarkovDistribution(emissions, [0.5, 0.5], [[1 - eps, eps], [eps, 1 - eps]], implementation)
        values.append(_e_step(model, seq_encode(seqs, model=model), None, compiled_route=True))
    assert np.all(np.isfinite(values[0][0]))
    np.testing.assert_allclose(values[0][0], values[1][0], rtol=1e-10)
    _assert_values_equal(values[0][1], values[1][1], rtol=1e-9)


def test_full_covariance_accumulators_take_the_stored_posteriors_route():
    """Axis-aligned Gaussian states fitted as full-covariance ones (their accumulators keep
    full second moments): the compiled pass makes no statistics for them, the E-step hands them
    the posteriors, and its statistics equal the log-space pass's."""
    emissions = [DiagonalGaussianDistribution([m, -m], [1.0, 2.0]) for m in (0.0, 2.0)]
    seqs = [np.random.default_rng(n).normal(0, 2, (n, 2)) for n in (4, 3, 9)]
    values = []
    for implementation in ("scaling", "log"):
        model = HiddenMarkovDistribution(emissions, [0.5, 0.5], [[0.9, 0.1], [0.2, 0.8]], implementation)
        estimator = HiddenMarkovEstimator([MultivariateGaussianEstimator(2), MultivariateGaussianEstimator(2)])
        enc = seq_encode(seqs, model=model)
        acc = estimator.make_accumulator()
        batch = enc.batches[0]
        source = compiled_source(model.emissions, batch.emissions)
        assert source is not None and compiled_statistics(acc.accumulators, *source, batch.emissions) is None
        values.append((np.asarray(acc.seq_update(enc, None, model)), acc.value()))
    np.testing.assert_allclose(values[0][0], values[1][0], rtol=1e-10)
    _assert_values_equal(values[0][1], values[1][1], rtol=1e-9)
