"""EM with the encodings on a chosen device. On this CPU-only machine the device is ``"cpu"``
passed explicitly: the same code a GPU runs (every tensor placed by ``device=``), checked
against the default path, scikit-learn and a real 2-rank gloo group. The CUDA comparison
itself is benchmarks/gpu_check.sh's."""

from __future__ import annotations

import dataclasses
import re
import warnings

import numpy as np
import pytest
import torch
from rank_functions import em_steps, outcome, params
from sklearn.mixture import GaussianMixture
from strictness import import_or_unavailable

from mixle_nb.inference import fit
from mixle_nb.parallel.local_launch import run_local
from mixle_nb.stats import (
    CategoricalDistribution,
    CategoricalEstimator,
    DiagonalGaussianDistribution,
    DiagonalGaussianEstimator,
    GaussianDistribution,
    GaussianEstimator,
    MixtureDistribution,
    MixtureEstimator,
    MultivariateGaussianEstimator,
    PoissonEstimator,
    SphericalGaussianDistribution,
    SphericalGaussianEstimator,
    em_step,
    seq_encode,
)

CPU = torch.device("cpu")
PROMPT_S = 5.0  # "at once": far below any group timeout
# A device this process cannot use: CUDA where there is none, else one index past the last GPU.
BOGUS = "cuda" if not torch.cuda.is_available() else f"cuda:{torch.cuda.device_count()}"


def _tensors(enc) -> list:
    return [v for f in dataclasses.fields(enc) if isinstance(v := getattr(enc, f.name), torch.Tensor)]


def _encoders():
    rng = np.random.default_rng(0)
    x3, x17 = rng.normal(size=(50, 3)), rng.normal(size=(50, 17))
    return [
        ("gaussian", rng.normal(size=50), GaussianEstimator()),
        ("diagonal", x3, DiagonalGaussianEstimator(3)),
        ("spherical", x3, SphericalGaussianEstimator(3)),
        ("full, D=3", x3, MultivariateGaussianEstimator(3)),
        ("full, D=17", x17, MultivariateGaussianEstimator(17)),
        ("poisson", rng.poisson(3.0, size=50), PoissonEstimator()),
        ("categorical", rng.choice(list("xyz"), size=50), CategoricalEstimator()),
        ("mixture", x3, MixtureEstimator([DiagonalGaussianEstimator(3)] * 2)),
    ]


@pytest.mark.parametrize("name, data, estimator", _encoders(), ids=[c[0] for c in _encoders()])
@pytest.mark.parametrize("device", ["cpu", CPU])
def test_every_encoding_lives_on_the_requested_device(name, data, estimator, device):
    enc = seq_encode(data, estimator=estimator, device=device)
    default = seq_encode(data, estimator=estimator)
    assert enc.device == CPU and _tensors(enc) and all(t.device == CPU for t in _tensors(enc))
    for mine, reference in zip(_tensors(enc), _tensors(default)):
        assert torch.equal(mine, reference)


@pytest.mark.parametrize(
    "device, message",
    [
        (
            BOGUS,
            r"device is 'cuda.*(CUDA is not available in this process.*pass device='cpu' or None|"
            r"this process sees \d+ CUDA device)",
        ),
        ("gpu", r"device 'gpu' is not a device name; use 'cpu', 'cuda' or 'cuda:N'"),
        (3, r"device must be a torch.device or its name"),
        ("meta", r"only 'cpu' and CUDA devices are supported"),
    ],
)
def test_an_unusable_device_is_refused_before_any_work(device, message):
    x = np.random.default_rng(1).normal(size=20)
    with pytest.raises(ValueError, match=message):
        seq_encode(x, estimator=GaussianEstimator(), device=device)
    with pytest.raises(ValueError, match=message):
        fit(x, MixtureEstimator([GaussianEstimator()] * 2), device=device, out=None)


def _sklearn_problem(covariance_type: str, dim: int, k: int = 8, n: int = 4000):
    rng = np.random.default_rng(0)
    means = rng.normal(0, 4, size=(k, dim))
    labels = rng.integers(k, size=n)
    x = means[labels] + rng.uniform(0.5, 1.5, size=(k, dim))[labels] * rng.standard_normal((n, dim))
    start_means = means + rng.normal(0, 0.5, size=means.shape)
    if covariance_type == "diag":
        start = MixtureDistribution(
            [DiagonalGaussianDistribution(m, np.ones(dim)) for m in start_means], np.full(k, 1.0 / k)
        )
        return (
            x,
            start,
            MixtureEstimator([DiagonalGaussianEstimator(dim, reg_covar=0.0) for _ in range(k)]),
            start_means,
        )
    if covariance_type == "spherical":
        start = MixtureDistribution([SphericalGaussianDistribution(m, 1.0) for m in start_means], np.full(k, 1.0 / k))
        return (
            x,
            start,
            MixtureEstimator([SphericalGaussianEstimator(dim, reg_covar=0.0) for _ in range(k)]),
            start_means,
        )
    start = MixtureDistribution([GaussianDistribution(m[0], 1.0) for m in start_means], np.full(k, 1.0 / k))
    return x[:, 0], start, MixtureEstimator([GaussianEstimator(reg_covar=0.0) for _ in range(k)]), start_means


@pytest.mark.parametrize("covariance_type, dim", [("1-D", 1), ("spherical", 3), ("diag", 8)])
def test_fit_on_an_explicit_device_matches_the_default_and_scikit_learn(covariance_type, dim):
    iterations = 20
    x, start, estimator, start_means = _sklearn_problem(covariance_type, dim)
    on_device = fit(x, estimator, init=start, max_its=iterations, delta=0.0, out=None, device="cpu")
    default = fit(x, estimator, init=start, max_its=iterations, delta=0.0, out=None)
    assert on_device.n_iter == default.n_iter
    iterations = on_device.n_iter  # EM may converge (gain <= 0) first: scikit-learn runs as many
    np.testing.assert_allclose(params(on_device.model), params(default.model), rtol=1e-12, atol=1e-12)
    assert on_device.log_density == pytest.approx(default.log_density, rel=1e-12)

    k = len(start.components)
    spherical = covariance_type == "spherical"
    gm = GaussianMixture(
        n_components=k,
        covariance_type="spherical" if spherical else "diag",
        max_iter=iterations,
        tol=0.0,
        reg_covar=0.0,
        weights_init=np.full(k, 1.0 / k),
        means_init=start_means,
        precisions_init=np.ones(k) if spherical else np.ones((k, dim)),
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "did not converge": exactly `iterations` are asked for
        gm.fit(x.reshape(len(x), dim))
    model = on_device.model
    np.testing.assert_allclose(model.w, gm.weights_, rtol=1e-6, atol=1e-12)
    np.testing.assert_allclose([np.atleast_1d(c.mu) for c in model.components], gm.means_, rtol=1e-6, atol=1e-9)
    variances = [c.variance if spherical else np.atleast_1d(c.sigma2) for c in model.components]
    np.testing.assert_allclose(variances, gm.covariances_, rtol=1e-6, atol=1e-9)
    enc = seq_encode(x, model=model, device="cpu")
    np.testing.assert_allclose(model.seq_log_density(enc), gm.score_samples(x.reshape(len(x), dim)), rtol=1e-8)


def test_kmeans_start_on_an_explicit_device_matches_the_default():
    x, _, estimator, _ = _sklearn_problem("diag", 4, k=4, n=2000)
    on_device = fit(x, estimator, init="kmeans++", max_its=3, out=None, rng=5, device="cpu")
    default = fit(x, estimator, init="kmeans++", max_its=3, out=None, rng=5)
    np.testing.assert_allclose(params(on_device.model), params(default.model), rtol=1e-12, atol=1e-12)


def test_fit_refuses_a_device_for_data_already_encoded():
    x = np.random.default_rng(4).normal(size=40)
    estimator = MixtureEstimator([GaussianEstimator()] * 2)
    with pytest.raises(ValueError, match=r"enc_data is encoded already.*seq_encode\(data, device=...\)"):
        fit(None, estimator, enc_data=seq_encode(x, estimator=estimator), device="cpu", out=None)


def test_mixle_encoders_encode_on_the_cpu_only():
    import_or_unavailable("mixle.stats")
    from mixle.stats import GaussianEstimator as MixleGaussianEstimator

    x = np.random.default_rng(2).normal(size=30)
    assert seq_encode(x, estimator=MixleGaussianEstimator(), device="cpu") is not None
    with pytest.raises(ValueError, match=r"encodes on the CPU only.*pass device=None or 'cpu'"):
        seq_encode(x, estimator=MixleGaussianEstimator(), device=torch.device("meta"))


# -- a real 2-rank gloo group --------------------------------------------------------------------


def _refusing_reader(path):
    raise AssertionError("the data were read although the device was refused")


def _ranks_on_device(rank, world, npy):
    import torch.distributed as dist

    from mixle_nb.parallel import TorchRunEncodedData

    dist.init_process_group("gloo")
    x, start, estimator, _ = _sklearn_problem("diag", 8)
    labels = np.random.default_rng(3).choice(list("abc"), size=300, p=[0.5, 0.3, 0.2])
    lstart = MixtureDistribution(
        [
            CategoricalDistribution({"a": 0.6, "b": 0.2, "c": 0.2}),
            CategoricalDistribution({"a": 0.2, "b": 0.4, "c": 0.4}),
        ],
        [0.5, 0.5],
    )
    out = {}
    for name, device in (("default", None), ("cpu", "cpu"), ("torch_device", CPU)):
        with TorchRunEncodedData(x, estimator=estimator, device=device) as h:
            out[name] = em_steps(h, estimator, start, steps=20)
            out[name + "_placed"] = (str(h.device), sorted({str(t.device) for c in h.chunks for t in _tensors(c)}))
            out[name + "_kmeans"] = params(h.pysp_kmeans_init(estimator, 7))
        with TorchRunEncodedData.from_npy(npy, estimator=estimator, device=device, sub_chunks=2) as h:
            out[name + "_npy"] = em_steps(h, estimator, start)
        with TorchRunEncodedData.from_files([npy], estimator=estimator, device=device) as h:
            out[name + "_files"] = em_steps(h, estimator, start)
        with TorchRunEncodedData(labels, model=lstart, device=device) as h:
            out[name + "_labels"] = em_steps(h, lstart.estimator(), lstart)
    out["everywhere"] = outcome(
        lambda: TorchRunEncodedData.from_files([npy], estimator=estimator, device=BOGUS, reader=_refusing_reader)
    )
    out["rank_one"] = outcome(
        lambda: TorchRunEncodedData.from_files(
            [npy], estimator=estimator, device=BOGUS if rank == 1 else "cpu", reader=np.load
        )
    )
    with TorchRunEncodedData(x, estimator=estimator, device="cpu") as h:  # the group is still in step
        out["after"] = em_steps(h, estimator, start, steps=1)
    dist.destroy_process_group()
    return out


@pytest.fixture(scope="module")
def rank_results(tmp_path_factory):
    x, _, _, _ = _sklearn_problem("diag", 8)
    npy = str(tmp_path_factory.mktemp("device") / "x.npy")
    np.save(npy, x)
    return run_local(_ranks_on_device, 2, npy=npy)


@pytest.mark.ranks
def test_handle_on_an_explicit_device_matches_the_default_on_every_rank(rank_results):
    for r in rank_results:
        for name in ("cpu", "torch_device"):
            assert r[name + "_placed"] == ("cpu", ["cpu"])
            for suffix in ("", "_npy", "_files", "_labels"):
                np.testing.assert_allclose(r[name + suffix][0], r["default" + suffix][0], rtol=1e-12, atol=1e-12)
                np.testing.assert_allclose(r[name + suffix][1], r["default" + suffix][1], rtol=1e-12)
            np.testing.assert_allclose(r[name + "_kmeans"], r["default_kmeans"], rtol=1e-12, atol=1e-12)
        assert np.array_equal(r["cpu"][0], rank_results[0]["cpu"][0])  # the model is identical on every rank


@pytest.mark.ranks
def test_handle_on_an_explicit_device_matches_scikit_learn(rank_results):
    x, start, _, start_means = _sklearn_problem("diag", 8)
    k = len(start.components)
    gm = GaussianMixture(
        n_components=k,
        covariance_type="diag",
        max_iter=20,
        tol=0.0,
        reg_covar=0.0,
        weights_init=np.full(k, 1.0 / k),
        means_init=start_means,
        precisions_init=np.ones((k, 8)),
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        gm.fit(x)
    expected = np.concatenate([gm.weights_] + [np.concatenate([m, v]) for m, v in zip(gm.means_, gm.covariances_)])
    np.testing.assert_allclose(rank_results[0]["cpu"][0], expected, rtol=1e-6, atol=1e-9)


@pytest.mark.ranks
def test_an_unusable_device_fails_every_rank_together_before_reading(rank_results):
    fix = r"CUDA is not available in this process.*pass device='cpu' or None|this process sees \d+ CUDA device"
    for rank, r in enumerate(rank_results):  # every rank refused: each raises its own error, naming itself
        kind, message, seconds = r["everywhere"]
        assert kind == "ValueError" and f"device on rank {rank} is '{BOGUS}'" in message and re.search(fix, message)
        assert seconds < PROMPT_S
    own, peer = rank_results[1]["rank_one"], rank_results[0]["rank_one"]
    assert own[0] == "ValueError" and "device on rank 1" in own[1] and re.search(fix, own[1])
    assert peer[0] == "PeerRankError" and f"rank 1: {own[1]}" in peer[1]
    assert own[2] < PROMPT_S and peer[2] < PROMPT_S
    x, start, estimator, _ = _sklearn_problem("diag", 8)
    one_step = em_step(seq_encode(x, model=start), estimator, start).model
    for r in rank_results:  # the group is still in step after the refusals
        np.testing.assert_allclose(r["after"][0], params(one_step), rtol=1e-10, atol=1e-12)
