"""The HMM family in the pysp protocol (mixle_nb.stats.hmm): forward–backward against a
brute-force sum over paths, both implementations on ragged sequences, values as plain sums
(chunks and ranks combine to one pass), a 2-rank handle equal to one process, sampling,
free parameters, decoding, random starts."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from mixle_nb.parallel.local_launch import run_local
from mixle_nb.stats import (
    CategoricalDistribution,
    DiagonalGaussianDistribution,
    GaussianDistribution,
    GaussianEstimator,
    MultivariateGaussianDistribution,
    PoissonDistribution,
    SphericalGaussianDistribution,
    em_step,
    free_parameters,
    seq_encode,
    seq_initialize,
)
from mixle_nb.stats.categorical import integer_labels
from mixle_nb.stats.frame import centred
from mixle_nb.stats.hmm import (
    HiddenMarkovDistribution,
    HiddenMarkovEncoder,
    HiddenMarkovEstimator,
    compiled,
    diagonal_states,
    forward_backward,
    scaled_kernel,
)
from mixle_nb.stats.hmm.columns import ColumnsDistribution
from mixle_nb.stats.hmm.emissions import EmissionKernel, add_emission_statistics
from mixle_nb.stats.hmm.encoding import locate_non_finite
from mixle_nb.stats.mixture import component_log_density

STARTPROB = [0.6, 0.3, 0.1]
TRANSMAT = [[0.7, 0.2, 0.1], [0.1, 0.8, 0.1], [0.3, 0.3, 0.4]]


def gaussian_model(implementation="log"):
    return HiddenMarkovDistribution(
        [GaussianDistribution(0.0, 1.0), GaussianDistribution(3.0, 0.5), GaussianDistribution(-2.0, 2.0)],
        STARTPROB,
        TRANSMAT,
        implementation,
    )


def ragged_sequences(seed=0, count=23):
    rng = np.random.default_rng(seed)
    return [rng.normal(size=int(n)) * 2 for n in rng.integers(1, 30, size=count)]


def brute_force(model, x):
    """log p(x) and the state posteriors by summing over every path."""
    k, t = model.n_states, len(x)
    log_b = np.array([[model.emissions[j].log_density(v) for j in range(k)] for v in x])
    joint = {}
    for path in itertools.product(range(k), repeat=t):
        lp = np.log(model.startprob[path[0]]) + log_b[0, path[0]]
        for s in range(1, t):
            lp += np.log(model.transmat[path[s - 1], path[s]]) + log_b[s, path[s]]
        joint[path] = lp
    total = np.logaddexp.reduce(list(joint.values()))
    post = np.zeros((t, k))
    for path, lp in joint.items():
        post[np.arange(t), path] += np.exp(lp - total)
    best = max(joint, key=joint.get)
    return total, post, np.array(best), joint[best]


@pytest.mark.parametrize("implementation", ["log", "scaling"])
def test_forward_backward_and_viterbi_equal_the_sum_over_paths(implementation):
    model = gaussian_model(implementation)
    seqs = [np.array([0.3, 2.5, -1.0, 3.1, 0.2]), np.array([1.0]), np.array([-3.0, 2.9, 2.8, 0.0])]
    enc = seq_encode(seqs, model=model)
    ll, post = model.seq_posteriors(enc)
    best_lp, states = model.seq_viterbi(enc)
    start = 0
    for i, x in enumerate(seqs):
        total, expected_post, best_path, best = brute_force(model, x)
        assert ll[i] == pytest.approx(total, rel=1e-13)
        np.testing.assert_allclose(post[start : start + len(x)], expected_post, atol=1e-13)
        np.testing.assert_array_equal(states[start : start + len(x)], best_path)
        assert best_lp[i] == pytest.approx(best, rel=1e-13)
        start += len(x)
    np.testing.assert_allclose(model.seq_log_density(enc), ll, rtol=1e-13)


def test_the_two_implementations_agree_and_batches_do_not_matter():
    seqs = ragged_sequences()
    steps = []
    for implementation, batch_elements in (("log", None), ("scaling", None), ("scaling", 40), ("log", 40)):
        model = gaussian_model(implementation)
        encoder = HiddenMarkovEncoder(model.emissions[0].dist_to_encoder(), 3, batch_elements)
        enc = encoder.seq_encode(seqs)
        assert (len(enc.batches) > 1) == (batch_elements is not None)
        steps.append(em_step(enc, model.estimator(), model))
    for step in steps[1:]:
        assert step.log_density == pytest.approx(steps[0].log_density, rel=1e-12)
        np.testing.assert_allclose(step.model.transmat, steps[0].model.transmat, atol=1e-12)
        np.testing.assert_allclose([e.mu for e in step.model.emissions], [e.mu for e in steps[0].model.emissions])


def test_values_are_sums_chunks_combine_to_one_pass():
    seqs = ragged_sequences(1)
    model = gaussian_model()
    estimator = model.estimator()
    whole = estimator.make_accumulator()
    whole.seq_update(seq_encode(seqs, model=model), None, model)
    parts = [estimator.make_accumulator() for _ in range(3)]
    for i, acc in enumerate(parts):
        acc.seq_update(seq_encode(seqs[i::3], model=model), None, model)
    combined = estimator.make_accumulator().from_value(parts[0].value())
    combined.combine(parts[1].value()).combine(parts[2].value())
    for a, b in zip(combined.value()[:3], whole.value()[:3]):
        np.testing.assert_allclose(a, b, rtol=1e-12)
    for a, b in zip(combined.value()[3], whole.value()[3]):
        np.testing.assert_allclose(a, b, rtol=1e-12)


def test_sequence_weights_equal_repeated_sequences():
    seqs = ragged_sequences(2, 5)
    model = gaussian_model("scaling")
    estimator = model.estimator()
    weighted = estimator.make_accumulator()
    weighted.seq_update(seq_encode(seqs, model=model), np.array([1.0, 2.0, 1.0, 3.0, 1.0]), model)
    repeated = estimator.make_accumulator()
    repeated.seq_update(seq_encode(seqs + [seqs[1], seqs[3], seqs[3]], model=model), None, model)
    np.testing.assert_allclose(weighted.value()[1], repeated.value()[1], rtol=1e-12)
    np.testing.assert_allclose(weighted.value()[3][2], repeated.value()[3][2], rtol=1e-12)


@pytest.mark.parametrize(
    "emissions",
    [
        [CategoricalDistribution({"a": 0.7, "b": 0.3}), CategoricalDistribution({"a": 0.2, "b": 0.8})],
        [PoissonDistribution(1.0), PoissonDistribution(6.0)],
        [DiagonalGaussianDistribution([0.0, 0.0], [1.0, 1.0]), DiagonalGaussianDistribution([3.0, 3.0], [1.0, 2.0])],
    ],
)
def test_any_emission_family_fits_and_never_falls(emissions):
    truth = HiddenMarkovDistribution(emissions, [0.5, 0.5], [[0.9, 0.1], [0.2, 0.8]], length=40)
    data = truth.sampler(4).sample(30)
    model = truth
    history = []
    enc = seq_encode(data, model=truth)
    estimator = truth.estimator()
    for _ in range(8):
        step = em_step(enc, estimator, model)
        history.append(step.log_density)
        model = step.model
    assert np.all(np.diff(history) >= -1e-9 * np.abs(history[1:]))


def test_free_parameters_and_random_start():
    model = gaussian_model()
    estimator = HiddenMarkovEstimator([GaussianEstimator() for _ in range(3)])
    assert free_parameters(estimator, model) == 2 + 6 + 3 * 2
    enc = seq_encode(ragged_sequences(3), model=model)
    start = seq_initialize(enc, estimator, np.random.default_rng(0), 1.0)
    assert isinstance(start, HiddenMarkovDistribution)
    np.testing.assert_allclose(start.transmat.sum(axis=1), 1.0)
    assert np.isfinite(em_step(enc, estimator, start).log_density)


def test_sample_sequence_and_draw():
    model = gaussian_model()
    x, states = model.sample_sequence(np.random.default_rng(0), 3000)
    assert x.shape == (3000,) and states.shape == (3000,)
    for k, mu in enumerate((0.0, 3.0, -2.0)):
        assert abs(x[states == k].mean() - mu) < 0.3
    with pytest.raises(ValueError, match="length=T"):
        model.sampler(0).sample(2)


def _two_rank_fit(rank, world):
    from mixle_nb.hmm import GaussianHMM
    from mixle_nb.parallel import TorchRunEncodedData

    seqs = [np.atleast_2d(s).T for s in ragged_sequences(5, 31)]
    out = {}
    for implementation in ("log", "scaling"):
        m = start_face(GaussianHMM, implementation)
        estimator = m.family_estimator()
        with TorchRunEncodedData(seqs, estimator=estimator) as handle:
            m.fit(handle)
            out[implementation] = face_numbers(m)
            out["local_sequences"] = handle.local_count
    symbols = symbol_sequences()
    c = start_categorical()
    with TorchRunEncodedData(symbols, estimator=c.family_estimator()) as handle:
        c.fit(handle)
        out["categorical"] = np.concatenate([c.startprob_, c.transmat_.ravel(), c.emissionprob_.ravel()])
        out["categorical_history"] = list(c.monitor_.history)
    seqs[3] = seqs[3].copy()
    seqs[3][2, 0] = np.nan  # sequence 3 of the data: rank 1's sequence 1
    try:
        TorchRunEncodedData(seqs, estimator=estimator)
    except Exception as exc:
        out["nan"] = str(exc)
    return out


def symbol_sequences():
    rng = np.random.default_rng(8)
    return [rng.choice(4, size=int(n), p=[0.4, 0.3, 0.2, 0.1]) for n in rng.integers(1, 25, size=27)]


def start_categorical():
    from mixle_nb.hmm import CategoricalHMM

    c = CategoricalHMM(3, init_params="", n_iter=6, tol=-np.inf, implementation="scaling")
    c.startprob_, c.transmat_ = np.array(STARTPROB), np.array(TRANSMAT)
    c.emissionprob_ = np.array([[0.5, 0.2, 0.2, 0.1], [0.1, 0.1, 0.4, 0.4], [0.25, 0.25, 0.25, 0.25]])
    return c


def start_face(cls, implementation):
    m = cls(3, covariance_type="diag", init_params="", n_iter=8, tol=-np.inf, implementation=implementation)
    m.startprob_, m.transmat_ = np.array(STARTPROB), np.array(TRANSMAT)
    m.means_, m.covars_ = np.array([[0.0], [3.0], [-2.0]]), np.array([[1.0], [0.5], [2.0]])
    return m


def face_numbers(m):
    return np.concatenate([m.startprob_, m.transmat_.ravel(), m.means_.ravel(), m._covars_.ravel()]), list(
        m.monitor_.history
    )


@pytest.mark.ranks
def test_two_rank_handle_fit_equals_one_process():
    from mixle_nb.hmm import GaussianHMM

    results = run_local(_two_rank_fit, 2, timeout=240)
    seqs = ragged_sequences(5, 31)
    X, lengths = np.concatenate(seqs)[:, None], [len(s) for s in seqs]
    assert sorted(r["local_sequences"] for r in results) == [15, 16]
    for implementation in ("log", "scaling"):
        single = start_face(GaussianHMM, implementation).fit(X, lengths)
        numbers, history = face_numbers(single)
        for r in results:
            ranked, ranked_history = r[implementation]
            np.testing.assert_allclose(ranked, numbers, rtol=1e-10, atol=1e-12)
            np.testing.assert_allclose(ranked_history, history, rtol=1e-10)
        assert np.all(np.diff(history) >= -1e-9 * np.abs(history[1:]))
        np.testing.assert_array_equal(results[0][implementation][0], results[1][implementation][0])
    # a NaN names the sequence as the user numbers it, and the rank that holds it
    assert "row 3 of the data is NaN or infinite" in results[1]["nan"] and "rank 1" in results[1]["nan"]
    assert "sequence 1, position 2" in results[1]["nan"]  # the encoder's own words, within the rank's part
    # categorical statistics are dicts of symbol counts: the handle folds them by gathering
    symbols = symbol_sequences()
    single = start_categorical().fit(np.concatenate(symbols)[:, None], [len(x) for x in symbols])
    expected = np.concatenate([single.startprob_, single.transmat_.ravel(), single.emissionprob_.ravel()])
    for r in results:
        np.testing.assert_allclose(r["categorical"], expected, rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(r["categorical_history"], list(single.monitor_.history), rtol=1e-10)


def test_scaled_pass_falls_back_to_dividing_every_step_on_near_impossible_chains():
    """Transitions of 1e-90 taken at every step: between two divisions the column sums would
    underflow (1e-360), so the scaled pass runs the batch again dividing at every step, and
    agrees with the log-space pass."""
    eps = 1e-90
    emissions = [GaussianDistribution(0.0, 1.0), GaussianDistribution(100.0, 1.0)]
    seqs = [np.tile([0.0, 100.0], 20), np.tile([100.0, 0.0, 0.0], 9)]
    results = []
    for implementation in ("scaling", "log"):
        model = HiddenMarkovDistribution(emissions, [0.5, 0.5], [[1 - eps, eps], [eps, 1 - eps]], implementation)
        enc = seq_encode(seqs, model=model)
        step = em_step(enc, model.estimator(), model)
        results.append((model.seq_log_density(enc), step.model.transmat))
    assert np.all(np.isfinite(results[0][0]))
    np.testing.assert_allclose(results[0][0], results[1][0], rtol=1e-12)
    np.testing.assert_allclose(results[0][1], results[1][1], rtol=1e-10, atol=1e-300)


# -- the compiled (numba) pass against the torch pass -------------------------------------------

RAGGED_LENGTHS = [1, 2, 7, 5, 2, 1, 13, 3, 2, 9]


def _state_families(rng):
    """Each emission family of three states, and a ragged set of its sequences."""
    cov = [np.eye(2), [[2.0, 0.5], [0.5, 1.0]], [[1.0, -0.3], [-0.3, 0.5]]]
    return {
        "gaussian": (
            [GaussianDistribution(m, v) for m, v in [(0.0, 1.0), (3.0, 0.5), (-2.0, 2.0)]],
            rng.normal(0, 3, 60),
        ),
        "diagonal": (
            [DiagonalGaussianDistribution([m, -m], [1.0, 1.0 + m * m]) for m in (0.0, 2.0, -1.5)],
            rng.normal(0, 2, (60, 2)),
        ),
        "full": (
            [MultivariateGaussianDistribution([m, m / 2], c) for m, c in zip((0.0, 2.0, -1.5), cov)],
            rng.normal(0, 2, (60, 2)),
        ),
        "spherical": (
            [SphericalGaussianDistribution([m, 1.0], 1.0 + m * m) for m in (0.0, 2.0, -1.5)],
            rng.normal(0, 2, (60, 2)),
        ),
        "categorical": (
            [CategoricalDistribution(dict(zip(range(4), p))) for p in rng.dirichlet(np.ones(4), 3)],
            rng.integers(0, 4, 60),
        ),
        "poisson": ([PoissonDistribution(lam) for lam in (0.5, 3.0, 9.0)], rng.poisson(3.0, 60)),
        "columns": (
            [
                ColumnsDistribution([PoissonDistribution(lam), PoissonDistribution(2 * lam + 1)])
                for lam in (0.5, 3.0, 9.0)
            ],
            rng.poisson(3.0, (60, 2)),
        ),
    }


@pytest.mark.parametrize("implementation", ["scaling", "log"])
@pytest.mark.parametrize("family", ["gaussian", "diagonal", "full", "spherical", "categorical", "poisson", "columns"])
def test_compiled_pass_equals_torch_pass_on_ragged_batches(implementation, family):
    """Sequences of lengths 1, 2 and odd lengths in one batch, with and without sequence
    weights: log-likelihoods, posteriors, expected starts and transitions of the compiled
    pass equal the torch pass's (the reference, as on a GPU) within 1e-12."""
    rng = np.random.default_rng(7)
    emissions, data = _state_families(rng)[family]
    model = HiddenMarkovDistribution(emissions, STARTPROB, TRANSMAT, implementation)
    ends = np.cumsum(RAGGED_LENGTHS)
    batch = seq_encode(np.split(data[: ends[-1]], ends[:-1]), model=model).batches[0]
    log_b, _ = model.log_b(batch)
    startprob, transmat = model.parameters_on(torch.device("cpu"))
    for weights in (None, torch.from_numpy(rng.uniform(0.1, 2.0, len(RAGGED_LENGTHS)))):
        ours = forward_backward(batch, log_b, startprob, transmat, implementation, weights, compiled=True)
        ours = {name: value.clone() for name, value in vars(ours).items()}  # gamma is a reused buffer
        reference = forward_backward(batch, log_b, startprob, transmat, implementation, weights, compiled=False)
        for name, value in ours.items():
            np.testing.assert_allclose(value.numpy(), getattr(reference, name).numpy(), rtol=1e-12, atol=1e-14)
        alone = forward_backward(batch, log_b, startprob, transmat, implementation, posteriors=False, compiled=True)
        np.testing.assert_allclose(alone.log_likelihood.numpy(), ours["log_likelihood"].numpy(), rtol=1e-12)


@pytest.mark.parametrize("states", [4, 6, 9])
def test_compiled_scaled_pass_equals_torch_pass_over_blocks_of_four_states(states):
    """The compiled scaled pass combines four states a pass (a multiple of four, and one, two or
    three left over): on ragged, weighted batches, its log-likelihoods, posteriors, expected
    starts and transitions equal the torch pass's within 1e-12."""
    rng = np.random.default_rng(states)
    emissions = [GaussianDistribution(m, 1.0 + m * m / 10) for m in np.linspace(-4.0, 4.0, states)]
    transmat = rng.dirichlet(np.ones(states), states)
    model = HiddenMarkovDistribution(emissions, rng.dirichlet(np.ones(states)), transmat, "scaling")
    ends = np.cumsum(RAGGED_LENGTHS)
    data = rng.normal(0, 3, ends[-1])
    batch = seq_encode(np.split(data, ends[:-1]), model=model).batches[0]
    log_b, _ = model.log_b(batch)
    startprob, transmat_t = model.parameters_on(torch.device("cpu"))
    weights = torch.from_numpy(rng.uniform(0.1, 2.0, len(RAGGED_LENGTHS)))
    ours = forward_backward(batch, log_b, startprob, transmat_t, "scaling", weights, compiled=True)
    ours = {name: value.clone() for name, value in vars(ours).items()}  # gamma is a reused buffer
    reference = forward_backward(batch, log_b, startprob, transmat_t, "scaling", weights, compiled=False)
    for name, value in ours.items():
        np.testing.assert_allclose(value.numpy(), getattr(reference, name).numpy(), rtol=1e-12, atol=1e-14)


def test_compiled_scaled_pass_far_from_every_state_and_on_near_impossible_chains():
    """Observations 1e4 standard deviations from every state (each emission underflows) and
    transitions of 1e-90 taken at every step: the compiled scaled pass stays finite and
    equals the log-space pass."""
    eps = 1e-90
    emissions = [GaussianDistribution(0.0, 1.0), GaussianDistribution(100.0, 1.0)]
    seqs = [np.tile([0.0, 100.0], 20), np.tile([100.0, 0.0, 0.0], 9), np.array([1e4, -1e4, 5e3])]
    passes = []
    for implementation in ("scaling", "log"):
        model = HiddenMarkovDistribution(emissions, [0.5, 0.5], [[1 - eps, eps], [eps, 1 - eps]], implementation)
        batch = seq_encode(seqs, model=model).batches[0]
        result = forward_backward(
            batch, model.log_b(batch)[0], *model.parameters_on(torch.device("cpu")), implementation
        )
        passes.append({name: value.clone() for name, value in vars(result).items()})
    assert np.all(np.isfinite(passes[0]["log_likelihood"].numpy()))
    for name in passes[0]:
        np.testing.assert_allclose(passes[0][name].numpy(), passes[1][name].numpy(), rtol=1e-10, atol=1e-300)


def test_compiled_exponential_is_within_two_ulps_of_numpys():
    """The vectorised exp of the compiled passes (for arguments <= 0, -inf and the subnormal
    range included) against NumPy's."""
    x = np.concatenate(
        [-np.logspace(-12, np.log10(745.0), 20001), [0.0, -0.0, -np.inf, -745.2, -746.0, -708.4, -800.0]]
    )
    ours = x.copy()
    compiled.exp_nonpositive(ours, np.empty(len(ours)))
    reference = np.exp(x)
    normal = reference > np.finfo(np.float64).tiny
    np.testing.assert_allclose(ours[normal], reference[normal], rtol=4.5e-16, atol=0)
    np.testing.assert_allclose(ours[~normal], reference[~normal], rtol=0, atol=1e-323)


@pytest.mark.parametrize(
    "values", [[5, 3, 3, 9, -2], [0], np.array([7, 7], dtype=np.uint8), np.arange(-50, 50) % 17, [0, 10**12]]
)
def test_integer_labels_equal_numpy_unique(values):
    """Integer labels counted (the categorical encoder's fast route) equal ``np.unique``'s."""
    values = np.asarray(values)
    labels, index = integer_labels(values)
    expected_labels, expected_index = np.unique(values, return_inverse=True)
    assert labels.dtype == expected_labels.dtype
    np.testing.assert_array_equal(labels, expected_labels)
    np.testing.assert_array_equal(index.reshape(-1), expected_index.reshape(-1))


@pytest.mark.parametrize("dim", [1, 3])
def test_diagonal_states_equal_the_mixture_kernels(dim):
    """The compiled route of axis-aligned Gaussian states (log-densities and M-step sums about
    each state's mean) against the mixtures' kernel and ``CentredBlock``, on points far from 0."""
    rng = np.random.default_rng(3)
    emissions = [DiagonalGaussianDistribution(1e4 + rng.normal(size=dim), rng.uniform(0.5, 2.0, dim)) for _ in range(4)]
    enc = emissions[0].dist_to_encoder().seq_encode(1e4 + rng.normal(size=(50, dim)))
    assert diagonal_states.applies(emissions, enc)
    log_b, block = diagonal_states.diagonal_log_b(emissions, enc)
    reference = torch.stack([component_log_density(e, enc) for e in emissions])
    np.testing.assert_allclose(log_b.numpy(), reference.numpy(), rtol=1e-12)
    weights = torch.from_numpy(rng.uniform(size=(4, 50)))
    mu = np.stack([e.mu for e in emissions])
    for full in (False, True):
        expected = centred(enc, mu).device_sums(weights, full).numpy()
        np.testing.assert_allclose(block.device_sums(weights, full).numpy(), expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("implementation", ["scaling", "log"])
def test_compiled_pass_over_several_tiles_of_sequences(implementation):
    """More sequences than one tile of the compiled scaled pass holds (two full tiles and a
    ragged rest, lengths 1 to 6), with sequence weights: equal to the torch pass."""
    rng = np.random.default_rng(11)
    model = gaussian_model(implementation)
    seqs = [rng.normal(0, 3, n) for n in rng.integers(1, 7, 2 * scaled_kernel.TILE + 37)]
    batch = seq_encode(seqs, model=model).batches[0]
    log_b, _ = model.log_b(batch)
    startprob, transmat = model.parameters_on(torch.device("cpu"))
    weights = torch.from_numpy(rng.uniform(0.1, 2.0, len(seqs)))
    ours = forward_backward(batch, log_b, startprob, transmat, implementation, weights, compiled=True)
    ours = {name: value.clone() for name, value in vars(ours).items()}
    reference = forward_backward(batch, log_b, startprob, transmat, implementation, weights, compiled=False)
    for name, value in ours.items():
        np.testing.assert_allclose(value.numpy(), getattr(reference, name).numpy(), rtol=1e-12, atol=1e-14)


def test_categorical_states_equal_the_per_state_kernels_and_counts():
    """The compiled route of categorical states (one gather of log-probabilities, one scatter
    of the posteriors into counts) against each state's own log-density and accumulator,
    with a label one state cannot emit."""
    rng = np.random.default_rng(5)
    emissions = [CategoricalDistribution(dict(zip("abcd", p))) for p in rng.dirichlet(np.ones(4), 2)]
    emissions.append(CategoricalDistribution({"a": 0.5, "b": 0.5}))
    enc = emissions[0].dist_to_encoder().seq_encode(rng.choice(list("abcd"), 40))
    log_b, terms = EmissionKernel(emissions)(enc)
    reference = torch.stack([component_log_density(e, enc) for e in emissions])
    np.testing.assert_array_equal(log_b.numpy(), reference.numpy())
    resp = torch.from_numpy(rng.uniform(size=(3, 40)))
    ours = [e.estimator().accumulator_factory().make() for e in emissions]
    add_emission_statistics(ours, enc, resp, emissions, terms)
    for acc, weights, emission in zip(ours, resp, emissions):
        expected = emission.estimator().accumulator_factory().make()
        expected.seq_update(enc, weights, emission)
        assert acc.value().keys() == expected.value().keys()
        counts = acc.value()
        np.testing.assert_allclose(
            [counts[label] for label in expected.value()], list(expected.value().values()), rtol=1e-12
        )


def test_non_finite_values_are_located_and_finite_sums_that_overflow_are_not_bad():
    """The encoder's NaN / infinity check: finite values whose sum overflows pass, and a bad
    value is named by its sequence and position."""
    x = np.array([1e308, 1e308, 1.0, -1e308])
    assert locate_non_finite(x, np.array([2, 2])) is None
    x[2] = np.nan
    assert locate_non_finite(x, np.array([2, 2])) == "sequence 1, position 0"
    x[2], x[0] = 1.0, -np.inf
    assert locate_non_finite(x, np.array([3, 1])) == "sequence 0, position 0"
