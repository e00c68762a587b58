"""The packing of equal-length sequences (stats/hmm/encoding.py's fast path: the packed index
as a broadcast ``(steps, batch)`` grid, the observations as a transposed copy of their block,
no per-row predecessor index) against the general ragged path: the packed index against a
loop over time steps, and the compiled forward–backward of equal-length sequences against the
same sequences packed ragged (one longer sequence added), both implementations, within 1e-12."""

from __future__ import annotations

import numpy as np
import pytest

from mixle_nb.stats import CategoricalDistribution, GaussianDistribution, accumulate
from mixle_nb.stats.hmm import HiddenMarkovDistribution
from mixle_nb.stats.hmm.encoding import packed_rows, packed_source, packed_steps

STEPS, SEQUENCES = 17, 300  # more sequences than the scaled pass's tile of 256


def loop_packing(starts: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The packed order by its definition: step by step, every sequence still running."""
    rows, offsets, sizes = [], [], []
    for t in range(int(lengths.max())):
        running = [int(s) + t for s, n in zip(starts, lengths) if n > t]
        offsets.append(len(rows))
        sizes.append(len(running))
        rows.extend(running)
    return np.array(rows), np.array(offsets), np.array(sizes)


@pytest.mark.parametrize("lengths", [[STEPS] * 9, [STEPS + 3, STEPS, STEPS, 5, 1]])
def test_the_packed_index_and_rows_are_the_loop_order(lengths):
    lengths = np.array(lengths)
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    x = np.random.default_rng(0).normal(size=(int(lengths.sum()), 3))
    offsets, sizes = packed_steps(lengths)
    rows, want = packed_source(starts, lengths, offsets, sizes), loop_packing(starts, lengths)
    for a, b in zip((rows, offsets, sizes), want):
        np.testing.assert_array_equal(a, b)
    # the block copy (equal lengths, consecutive) is the gather
    np.testing.assert_array_equal(packed_rows(x, starts, lengths, offsets, sizes), x[want[0]])


def models(implementation: str) -> list[HiddenMarkovDistribution]:
    """A Gaussian and a categorical three-state HMM."""
    startprob, transmat = [0.5, 0.3, 0.2], [[0.8, 0.1, 0.1], [0.2, 0.7, 0.1], [0.25, 0.25, 0.5]]
    gaussian = [GaussianDistribution(-2.0, 1.0), GaussianDistribution(0.5, 0.5), GaussianDistribution(3.0, 2.0)]
    categorical = [
        CategoricalDistribution({0: 0.6, 1: 0.3, 2: 0.1}),
        CategoricalDistribution({0: 0.1, 1: 0.8, 2: 0.1}),
        CategoricalDistribution({0: 0.2, 1: 0.2, 2: 0.6}),
    ]
    return [HiddenMarkovDistribution(e, startprob, transmat, implementation) for e in (gaussian, categorical)]


def flat(value) -> np.ndarray:
    """A statistic as one float64 vector (a dict's values in the order of its keys)."""
    if isinstance(value, dict):
        return np.array([value[key] for key in sorted(value)], dtype=np.float64)
    if isinstance(value, (list, tuple)):
        return np.concatenate([flat(v) for v in value])
    return np.atleast_1d(np.asarray(value, dtype=np.float64)).ravel()


def statistics(model: HiddenMarkovDistribution, sequences: list) -> list[np.ndarray]:
    """The E-step's sums (starts, transitions, occupancy, each state's emission sums)."""
    start, transitions, occupancy, emissions = accumulate(
        [model.dist_to_encoder().seq_encode(sequences)], model.estimator(), model
    ).accumulator.value()
    return [flat(start), flat(transitions), flat(occupancy)] + [flat(e) for e in emissions]


@pytest.mark.parametrize("implementation", ["log", "scaling"])
def test_equal_length_sequences_pass_as_the_ragged_packing_does(implementation):
    """Equal-length sequences (the fast path) against the same sequences beside one longer
    sequence (the general path): each shared sequence's log-likelihood and posteriors, and
    the sums, which add the longer sequence's own."""
    for model in models(implementation):
        rng = np.random.default_rng(1)
        equal = [model.sample_sequence(rng, STEPS)[0] for _ in range(SEQUENCES)]
        longer = model.sample_sequence(rng, STEPS + 4)[0]
        encoder = model.dist_to_encoder()
        fast, ragged = encoder.seq_encode(equal), encoder.seq_encode([longer, *equal])
        assert len(fast.batches) == len(ragged.batches) == 1
        assert fast.batches[0].previous is None and ragged.batches[0].previous is not None  # the two paths
        ll_fast, post_fast = model.seq_posteriors(fast)
        ll_ragged, post_ragged = model.seq_posteriors(ragged)
        np.testing.assert_allclose(ll_fast, ll_ragged[1:], rtol=1e-12)
        np.testing.assert_allclose(post_fast, post_ragged[len(longer) :], rtol=0, atol=1e-12)
        alone = statistics(model, [longer])
        for got, with_longer, own in zip(statistics(model, equal), statistics(model, [longer, *equal]), alone):
            np.testing.assert_allclose(got + own, with_longer, rtol=1e-12, atol=1e-12)
