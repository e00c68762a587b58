"""Bad input to mixle_nb.hmm: hmmlearn's errors (and its messages where it has one), raised
before any work; a NaN or infinite value named by sequence and position."""

from __future__ import annotations

import re

import numpy as np
import pytest

pytest.importorskip("sklearn")

from mixle_nb.hmm import CategoricalHMM, GaussianHMM, PoissonHMM  # noqa: E402
from mixle_nb.stats import GaussianDistribution  # noqa: E402
from mixle_nb.stats.hmm import HiddenMarkovDistribution  # noqa: E402


def gaussian():
    m = GaussianHMM(2, init_params="", n_iter=2)
    m.startprob_, m.transmat_ = np.array([0.5, 0.5]), np.array([[0.9, 0.1], [0.2, 0.8]])
    m.means_, m.covars_ = np.array([[0.0], [3.0]]), np.array([[1.0], [1.0]])
    return m


def no_work(monkeypatch):
    """Fail the test if the E-step starts."""
    import mixle_nb.hmm.base as base

    def refuse(*args, **kwargs):
        raise AssertionError("the E-step started")

    monkeypatch.setattr(base, "em_step", refuse)


def test_lengths_not_summing_to_the_rows(monkeypatch):
    no_work(monkeypatch)
    X = np.zeros((10, 1))
    with pytest.raises(ValueError, match=re.escape("lengths array [3 4] doesn't sum to 10 samples")):
        gaussian().fit(X, [3, 4])
    with pytest.raises(ValueError, match=re.escape("lengths array [3 4] doesn't sum to 10 samples")):
        gaussian().score(X, [3, 4])


def test_a_zero_length(monkeypatch):
    no_work(monkeypatch)
    with pytest.raises(
        ValueError,
        match=re.escape("lengths array [4 0 6] has length 0 at sequence 1: every sequence needs at least one sample"),
    ):
        gaussian().fit(np.zeros((10, 1)), [4, 0, 6])


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_nan_or_infinity_names_sequence_and_position(monkeypatch, bad):
    no_work(monkeypatch)
    X = np.zeros((10, 1))
    X[7, 0] = bad
    message = "Input X contains NaN or infinity at sequence 1, position 3 (row 7); drop or impute it first"
    with pytest.raises(ValueError, match=re.escape(message)):
        gaussian().fit(X, [4, 6])
    with pytest.raises(ValueError, match=re.escape(message)):
        gaussian().predict(X, [4, 6])


def test_the_family_encoder_names_sequence_and_position_too():
    model = HiddenMarkovDistribution(
        [GaussianDistribution(0.0, 1.0), GaussianDistribution(1.0, 1.0)], [0.5, 0.5], [[0.5, 0.5], [0.5, 0.5]]
    )
    with pytest.raises(ValueError, match=re.escape("sequence 2, position 1 is NaN or infinite")):
        model.dist_to_encoder().seq_encode([[0.0], [1.0, 2.0], [3.0, np.nan]])
    with pytest.raises(ValueError, match="sequence 1 has length 0"):
        model.dist_to_encoder().seq_encode([[0.0], []])


def test_symbols(monkeypatch):
    no_work(monkeypatch)
    with pytest.raises(ValueError, match="^Symbols should be integers$"):
        CategoricalHMM(2).fit(np.array([[0.5], [1.0]]))
    with pytest.raises(ValueError, match="^Symbols should be nonnegative$"):
        CategoricalHMM(2).fit(np.array([[0], [-1]]))
    with pytest.raises(ValueError, match=re.escape("Largest symbol is 4 but the model only emits symbols up to 2")):
        CategoricalHMM(2, n_features=3).fit(np.array([[0], [4], [1]]))


def test_not_stochastic(monkeypatch):
    no_work(monkeypatch)
    X = np.zeros((4, 1))
    m = gaussian()
    m.startprob_ = np.array([0.5, 0.6])
    with pytest.raises(ValueError, match=re.escape("startprob_ must sum to 1 (got 1.1000)")):
        m.fit(X)
    m = gaussian()
    m.transmat_ = np.array([[0.9, 0.2], [0.2, 0.8]])
    with pytest.raises(ValueError, match=re.escape("transmat_ rows must sum to 1 (got row sums of [1.1 1. ])")):
        m.fit(X)
    with pytest.raises(ValueError, match=re.escape("transmat_ rows must sum to 1")):
        m.score(X)
    m = gaussian()
    m.transmat_ = np.eye(3)
    with pytest.raises(ValueError, match=re.escape("transmat_ must have shape (n_components, n_components)")):
        m.fit(X)


def test_other_hmmlearn_errors():
    with pytest.raises(ValueError, match=re.escape("Unknown decoder 'nope'")):
        gaussian().decode(np.zeros((3, 1)), algorithm="nope")
    m = gaussian()
    with pytest.raises(ValueError, match="'diag' covars must be positive"):
        m.covars_ = np.array([[1.0], [-1.0]])
    m = PoissonHMM(2, init_params="")
    m.startprob_, m.transmat_ = np.array([0.5, 0.5]), np.array([[0.9, 0.1], [0.2, 0.8]])
    m.lambdas_ = np.array([[1.0, 2.0]])
    with pytest.raises(ValueError, match=re.escape("lambdas_ must have shape (n_components, n_features)")):
        m.fit(np.zeros((3, 2)))
    with pytest.raises(ValueError, match=re.escape("Unexpected number of dimensions, got 2 but expected 1")):
        gaussian().fit(np.zeros((3, 1))).fit(np.zeros((3, 2)))


# -- sequences read where they sit (a handle of whole sequences), before any work -----------------


def symbol_face(n_features=3):
    c = CategoricalHMM(2, init_params="", n_iter=2, n_features=n_features)
    c.startprob_, c.transmat_ = np.array([0.5, 0.5]), np.array([[0.9, 0.1], [0.2, 0.8]])
    c.emissionprob_ = np.full((2, n_features), 1 / n_features)
    return c


def test_lengths_files_named_by_global_sequence(tmp_path):
    from mixle_nb.parallel import TorchRunEncodedData

    np.save(tmp_path / "x.npy", np.zeros((10, 1)))
    estimator = gaussian().family_estimator()

    def from_npy(lengths):
        return TorchRunEncodedData.from_npy(tmp_path / "x.npy", estimator, lengths=lengths, init_process_group=False)

    with pytest.raises(ValueError, match=re.escape("lengths array [3 4] doesn't sum to 10 samples (the rows of")):
        from_npy([3, 4])
    with pytest.raises(ValueError, match=r"sequence 2 \(the rows of .*x\.npy\) has length 0 on rank 0 \(logical"):
        from_npy(np.array([4, 6, 0]))
    with pytest.raises(ValueError, match="must be a 1-D array of integers"):
        from_npy(np.array([4.0, 6.0]))
    # a block of sequences per file: the global index counts through the files as listed
    for i, lengths in enumerate(([2, 3], [1, 0, 4])):
        np.save(tmp_path / f"b{i}.npy", np.zeros((sum(lengths), 1)))
        np.save(tmp_path / f"b{i}_lengths.npy", np.array(lengths))
    paths = [str(tmp_path / f"b{i}.npy") for i in range(2)]
    lengths_files = [str(tmp_path / f"b{i}_lengths.npy") for i in range(2)]
    with pytest.raises(ValueError, match=r"sequence 3 \(.*b1\.npy, lengths in .*, its sequence 1\) has length 0"):
        TorchRunEncodedData.from_files(paths, estimator, lengths=lengths_files, init_process_group=False)
    with pytest.raises(ValueError, match="one lengths file per data file"):
        TorchRunEncodedData.from_files(paths, estimator, lengths=lengths_files[:1], init_process_group=False)


def test_a_zero_length_sequence_in_a_handle_names_its_global_index():
    from mixle_nb.parallel import TorchRunEncodedData

    seqs = [np.zeros((3, 1)), np.zeros((2, 1)), np.zeros((0, 1))]
    with pytest.raises(ValueError, match=re.escape("row 2 of the data has length 0 on rank 0: every sequence needs")):
        TorchRunEncodedData(seqs, gaussian().family_estimator(), init_process_group=False)


def test_symbols_on_a_handle(monkeypatch):
    from mixle_nb.parallel import TorchRunEncodedData

    no_work(monkeypatch)
    seqs = [np.array([0, 1, 2]), np.array([2, 1]), np.array([0, 4, 1, 5])]
    with TorchRunEncodedData(seqs, symbol_face().family_estimator(), init_process_group=False) as h:
        message = (
            "Largest symbol is 5 but the model only emits symbols up to 2: sequence 2, position 1 holds 4 "
            "(on rank 0); pass n_features=6"
        )
        with pytest.raises(ValueError, match=re.escape(message)):
            symbol_face().fit(h)
    seqs[1] = np.array([2.0, -1.0])
    with TorchRunEncodedData(seqs, symbol_face().family_estimator(), init_process_group=False) as h:
        message = "Symbols should be nonnegative: sequence 1, position 1 holds -1 (on rank 0)"
        with pytest.raises(ValueError, match=re.escape(message)):
            symbol_face().fit(h)


def test_not_stochastic_on_a_handle(monkeypatch):
    from mixle_nb.parallel import TorchRunEncodedData

    no_work(monkeypatch)
    with TorchRunEncodedData([np.zeros((3, 1))], gaussian().family_estimator(), init_process_group=False) as h:
        m = gaussian()
        m.startprob_, m.n_features = np.array([0.5, 0.6]), 1  # a fit on a handle does not see the width
        with pytest.raises(ValueError, match=re.escape("startprob_ must sum to 1 (got 1.1000)")):
            m.fit(h)
