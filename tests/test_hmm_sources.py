"""An HMM's sequences read where they sit: ``from_npy(path, lengths=...)`` (row-balanced blocks of
whole sequences) and ``from_files(paths, lengths=...)`` (one sequence per file, or a block of
sequences per file with its lengths file). A fit on such a handle equals hmmlearn-style
``fit(X, lengths)`` in one process (within 1e-10, GaussianHMM and CategoricalHMM) on one process,
2 ranks and through a cluster reference; bad input is named by global sequence, position and rank,
on every rank together."""

from __future__ import annotations

import re

import numpy as np
import pytest

pytest.importorskip("sklearn")

from mixle_nb.hmm import CategoricalHMM, GaussianHMM  # noqa: E402
from mixle_nb.parallel import TorchRunEncodedData  # noqa: E402
from mixle_nb.parallel.sequence_sources import balanced_cuts  # noqa: E402

LENGTHS = np.random.default_rng(5).integers(3, 60, size=29)


def gaussian_rows() -> np.ndarray:
    """Rows of 2-D observations, the sequences one after another, from two regimes."""
    rng = np.random.default_rng(6)
    regime = (np.arange(LENGTHS.sum()) // 9) % 2
    return rng.normal(size=(LENGTHS.sum(), 2)) + 3.0 * regime[:, None]


def symbols() -> np.ndarray:
    rng = np.random.default_rng(7)
    return rng.choice(4, size=int(LENGTHS.sum()), p=[0.4, 0.3, 0.2, 0.1])


def gaussian_face(implementation: str = "log") -> GaussianHMM:
    m = GaussianHMM(2, covariance_type="full", init_params="", n_iter=6, tol=-np.inf, implementation=implementation)
    m.startprob_, m.transmat_ = np.array([0.6, 0.4]), np.array([[0.8, 0.2], [0.3, 0.7]])
    m.means_ = np.array([[0.5, 0.0], [2.0, 2.5]])
    m.covars_ = np.array([np.eye(2), 2 * np.eye(2)])
    m.n_features = 2
    return m


def categorical_face() -> CategoricalHMM:
    c = CategoricalHMM(2, init_params="", n_iter=6, tol=-np.inf, n_features=4, implementation="scaling")
    c.startprob_, c.transmat_ = np.array([0.5, 0.5]), np.array([[0.9, 0.1], [0.2, 0.8]])
    c.emissionprob_ = np.array([[0.4, 0.3, 0.2, 0.1], [0.1, 0.2, 0.3, 0.4]])
    return c


def numbers(m) -> np.ndarray:
    emissions = (m.means_, m.covars_) if isinstance(m, GaussianHMM) else (m.emissionprob_,)
    return np.concatenate([a.ravel() for a in (m.startprob_, m.transmat_, *emissions)] + [m.monitor_.history])


def write_data(folder) -> dict:
    """The rows and lengths as one file, as three blocks with lengths files, one file a sequence."""
    x, s = gaussian_rows(), symbols()
    np.save(folder / "x.npy", x)
    np.save(folder / "s.npy", s)
    np.save(folder / "lengths.npy", LENGTHS)
    ends = np.cumsum(LENGTHS)
    paths = {"blocks": [], "block_lengths": [], "per_file": []}
    for i, (a, b) in enumerate(((0, 10), (10, 11), (11, 29))):  # sequences a..b-1 in file i
        rows = slice(int(ends[a] - LENGTHS[a]), int(ends[b - 1]))
        np.save(folder / f"x{i}.npy", x[rows])
        np.save(folder / f"x{i}_lengths.npy", LENGTHS[a:b])
        paths["blocks"].append(str(folder / f"x{i}.npy"))
        paths["block_lengths"].append(str(folder / f"x{i}_lengths.npy"))
    for i, (a, b) in enumerate(zip(ends - LENGTHS, ends)):
        np.save(folder / f"s{i}.npy", s[a:b])
        paths["per_file"].append(str(folder / f"s{i}.npy"))
    return paths


def expected() -> dict:
    return {
        "npy": numbers(gaussian_face().fit(gaussian_rows(), LENGTHS)),
        "scaling": numbers(gaussian_face("scaling").fit(gaussian_rows(), LENGTHS)),
        "categorical": numbers(categorical_face().fit(symbols()[:, None], LENGTHS)),
    }


def fits(folder: str, paths: dict, **options) -> dict:
    """Every kind of source, fitted; ``options`` go to each handle (``init_process_group``)."""
    out = {}
    with TorchRunEncodedData.from_npy(
        f"{folder}/x.npy", gaussian_face().family_estimator(), lengths=f"{folder}/lengths.npy", **options
    ) as h:
        out["npy"] = numbers(gaussian_face().fit(h))
        out["held"] = (
            h.local_count,
            [(int(h.source.cuts[s]), int(h.source.cuts[s + 1])) for s, _, _ in h.shard_chunks],
        )
    with TorchRunEncodedData.from_files(
        paths["blocks"], gaussian_face().family_estimator(), lengths=paths["block_lengths"], sub_chunks=2, **options
    ) as h:
        out["scaling"] = numbers(gaussian_face("scaling").fit(h))
    with TorchRunEncodedData.from_files(
        paths["per_file"], categorical_face().family_estimator(), lengths="per_file", **options
    ) as h:
        out["categorical"] = numbers(categorical_face().fit(h))
    with TorchRunEncodedData.from_npy(
        f"{folder}/s.npy", categorical_face().family_estimator(), lengths=LENGTHS, shards=3, **options
    ) as h:
        out["categorical_npy"] = numbers(categorical_face().fit(h))
    return out


def test_one_process_sources_equal_the_array_fit(tmp_path):
    paths = write_data(tmp_path)
    got, want = fits(str(tmp_path), paths, init_process_group=False), expected()
    for name in ("npy", "scaling", "categorical"):
        np.testing.assert_allclose(got[name], want[name], rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(got["categorical_npy"], want["categorical"], rtol=1e-10, atol=1e-12)
    assert got["held"] == (29, [(0, 29)])


def test_balanced_cuts_keep_sequences_whole():
    ends = np.cumsum(LENGTHS)
    for shards in (1, 2, 3, 7, 40):
        cuts = balanced_cuts(ends, shards)
        assert cuts[0] == 0 and cuts[-1] == len(LENGTHS) and np.all(np.diff(cuts) >= 0)
        rows = np.diff(np.concatenate([[0], ends])[cuts])
        # every block is within one sequence of its share of the rows
        assert np.all(np.abs(rows - ends[-1] / shards) <= LENGTHS.max())


def _bad(call) -> str:
    try:
        call()
    except Exception as exc:  # every rank's own error or PeerRankError, as a string
        return f"{type(exc).__name__}: {exc}"
    return "no error"


def _on_two_ranks(folder, paths):
    """On each cluster rank: every source fitted, then the bad inputs, each caught as text."""
    out = fits(folder, paths)
    est = gaussian_face().family_estimator()
    out["zero"] = _bad(lambda: TorchRunEncodedData.from_npy(f"{folder}/x.npy", est, lengths=f"{folder}/zero.npy"))
    out["sum"] = _bad(lambda: TorchRunEncodedData.from_npy(f"{folder}/x.npy", est, lengths=LENGTHS[:-1]))
    out["nan"] = _bad(lambda: TorchRunEncodedData.from_npy(f"{folder}/nan.npy", est, lengths=LENGTHS))
    seqs = [np.zeros((3, 2)) for _ in range(5)]
    seqs[3] = np.zeros((0, 2))  # rank 1's sequence 1
    out["zero_list"] = _bad(lambda: TorchRunEncodedData(seqs, est))
    out["block_sum"] = _bad(
        lambda: TorchRunEncodedData.from_files(paths["blocks"], est, lengths=paths["block_lengths"][::-1])
    )
    with TorchRunEncodedData.from_files(
        paths["per_file"], categorical_face().family_estimator(), lengths="per_file"
    ) as h:
        small = categorical_face()
        small.n_features, small.emissionprob_ = 3, np.full((2, 3), 1 / 3)
        out["symbol"] = _bad(lambda: small.fit(h))
        bad_start = categorical_face()
        bad_start.transmat_ = np.array([[0.9, 0.2], [0.2, 0.8]])
        out["stochastic"] = _bad(lambda: bad_start.fit(h))
        out["after"] = numbers(categorical_face().fit(h))  # the handle still works
    return out


@pytest.mark.cluster
def test_two_ranks_hold_whole_sequences_and_equal_one_process(cluster2, tmp_path):
    paths = write_data(tmp_path)
    zero = LENGTHS.copy()
    zero[20] = 0  # sequence 20: on rank 1 (logical shard 1 starts near half the rows)
    np.save(tmp_path / "zero.npy", zero)
    x = gaussian_rows()
    x[int(np.cumsum(LENGTHS)[16]) + 4, 1] = np.nan  # sequence 17, position 4
    np.save(tmp_path / "nan.npy", x)
    results = cluster2.run(_on_two_ranks, str(tmp_path), paths)
    want = expected()
    for r in results:
        for name in ("npy", "scaling", "categorical"):
            np.testing.assert_allclose(r[name], want[name], rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(r["categorical_npy"], want["categorical"], rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(r["after"], want["categorical"], rtol=1e-10, atol=1e-12)
    # each rank holds a contiguous block of whole sequences, about half the rows
    (n0, [(a0, b0)]), (n1, [(a1, b1)]) = results[0]["held"], results[1]["held"]
    assert (a0, b1) == (0, 29) and b0 == a1 and n0 + n1 == 29
    ends = np.concatenate([[0], np.cumsum(LENGTHS)])
    assert abs((ends[b0] - ends[a0]) - LENGTHS.sum() / 2) <= LENGTHS.max()
    assert 20 >= a1, "the test's zero-length sequence must lie on rank 1"
    # bad input: on every rank, naming the global sequence, its position and the rank
    for r in results:
        assert re.search(r"sequence 20 \(the rows of .*x\.npy\) has length 0 on rank 1 \(logical shard 1\)", r["zero"])
        assert "lengths array" in r["sum"] and f"doesn't sum to {LENGTHS.sum()} samples" in r["sum"]
        assert "Largest symbol is 3 but the model only emits symbols up to 2: sequence " in r["symbol"]
        assert "transmat_ rows must sum to 1" in r["stochastic"]
    starts = ends[:-1]
    g = next(i for i in range(29) if np.any(symbols()[starts[i] : ends[i + 1]] == 3))
    position = int(np.flatnonzero(symbols()[starts[g] : ends[g + 1]] == 3)[0])
    for r in results:  # one sequence a file, file g on rank g % 2
        assert f"sequence {g}, position {position} holds 3 (on rank {g % 2})" in r["symbol"]
    assert "sequence 17 of" in results[1]["nan"] and "is NaN or infinite" in results[1]["nan"]
    assert "rank 1" in results[1]["nan"] and "position 4" in results[1]["nan"]
    assert "PeerRankError" in results[0]["nan"] and "rank 1" in results[0]["nan"]
    assert "row 3 of the data has length 0 on rank 1" in results[1]["zero_list"]
    assert "PeerRankError" in results[0]["zero_list"]
    # the blocks' lengths files in the wrong order: the rank reading a file names it and itself
    assert any(
        re.search(r"doesn't sum to \d+ samples \(.*x\d\.npy, lengths in .*on rank \d\)", r["block_sum"])
        for r in results
    )


def _handle_on_rank(folder):
    """On a cluster rank: a handle of the file's whole sequences."""
    from mixle_nb.cluster.rank_side import rank_namespace

    ns = rank_namespace()
    estimator = ns["hmm_face"].family_estimator()
    ns["h_seq_npy"] = TorchRunEncodedData.from_npy(f"{folder}/x.npy", estimator, lengths=f"{folder}/lengths.npy")
    return ns["h_seq_npy"].local_count


@pytest.mark.cluster
def test_fit_through_a_cluster_reference_of_a_file(cluster2, tmp_path):
    write_data(tmp_path)
    cluster2.push(hmm_face=gaussian_face())
    counts = cluster2.run(_handle_on_rank, str(tmp_path))
    assert sum(counts) == 29 and min(counts) > 0
    fitted = gaussian_face().fit(cluster2.handle("h_seq_npy"))
    np.testing.assert_allclose(numbers(fitted), expected()["npy"], rtol=1e-10, atol=1e-12)
    bad = gaussian_face()
    bad.startprob_ = np.array([0.6, 0.6])
    with pytest.raises(ValueError, match=re.escape("startprob_ must sum to 1 (got 1.2000)")):
        bad.fit(cluster2.handle("h_seq_npy"))  # refused here, before the ranks work
    cluster2.run(_close_on_rank)


def _close_on_rank():
    from mixle_nb.cluster.rank_side import rank_namespace

    rank_namespace().pop("h_seq_npy").close()
