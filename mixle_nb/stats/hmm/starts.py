"""k-means starts for an HMM's emissions: k-means‖ (or random observations) over every
sequence's observations, as for a mixture of the states' families, then hmmlearn's chain start
(uniform start and transition probabilities).

States that emit from Gaussian mixtures (``GMMHMM``'s) start in two levels, as hmmlearn's
``GMMHMM`` does: k-means of the states over all observations, then, within the observations
nearest each state's centre, k-means of the state's mixture components. Every level runs where
the data live, with the same collectives on every rank, so the start depends only on the seed
and the world size."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..base import Distribution, random_source
from ..kmeans import Exchange, encoded_points, kmeans_init
from ..mixture import MixtureDistribution, MixtureEstimator
from .encoding import SequenceEncoding
from .model import HiddenMarkovDistribution, HiddenMarkovEstimator


def kmeans_states(
    chunks: list[SequenceEncoding],
    estimator: HiddenMarkovEstimator,
    rng: Any,
    exchange: Exchange,
    init: str = "kmeans++",
    lloyd_iterations: int = 1,
) -> HiddenMarkovDistribution:
    """An HMM start whose states emit as the mixture :func:`~mixle_nb.stats.kmeans.kmeans_init`
    finds in the observations of every sequence (each rank passing its own chunks), with
    uniform start and transition probabilities (hmmlearn's start of the chain).

    Parameters
    ----------
    chunks : list of SequenceEncoding
        This rank's encoded sequences.
    estimator : HiddenMarkovEstimator
        The HMM family; its emission estimators are the mixture's components.
    rng : None, int, numpy.random.Generator or numpy.random.RandomState
        The random source (the same on every rank).
    exchange : Exchange
        How the ranks share sums (one process: ``SingleProcess()``).
    init : {"kmeans++", "random_from_data"}
        How the centres are chosen.
    lloyd_iterations : int
        Lloyd iterations after k-means‖.

    Returns
    -------
    HiddenMarkovDistribution
        The start, identical on every rank.

    Raises
    ------
    ValueError
        Emissions whose family k-means cannot start (not Gaussian), or no observations.

    Examples
    --------
    >>> from mixle_nb.stats import GaussianEstimator, seq_encode
    >>> from mixle_nb.stats.kmeans import SingleProcess
    >>> estimator = HiddenMarkovEstimator([GaussianEstimator(), GaussianEstimator()])
    >>> enc = seq_encode([[0.1, -0.2, 0.0, 5.1], [4.9, 5.0, 0.2]], estimator=estimator)
    >>> start = kmeans_states([enc], estimator, 0, SingleProcess())
    >>> sorted(round(e.mu, 1) for e in start.emissions), start.transmat.tolist()
    ([0.0, 5.0], [[0.5, 0.5], [0.5, 0.5]])
    """
    emissions = [batch.emissions for enc in chunks for batch in enc.batches]
    k = len(estimator.estimators)
    mixtures = [state for state in estimator.estimators if isinstance(state, MixtureEstimator)]
    states: list[Distribution]
    if len(mixtures) == k:  # GMMHMM's states
        states = list(mixture_states(emissions, mixtures, random_source(rng), exchange, init, lloyd_iterations))
    else:
        states = _mixture(
            kmeans_init(
                emissions,
                MixtureEstimator(estimator.estimators),
                rng,
                exchange,
                init,
                lloyd_iterations=lloyd_iterations,
            )
        ).components
    return HiddenMarkovDistribution(states, np.full(k, 1.0 / k), np.full((k, k), 1.0 / k), estimator.implementation)


def _mixture(model: Distribution) -> MixtureDistribution:
    """``model``, which :func:`kmeans_init` estimated with a mixture estimator."""
    assert isinstance(model, MixtureDistribution)
    return model


def mixture_states(
    emissions: list,
    states: list[MixtureEstimator],
    rng: np.random.Generator,
    exchange: Exchange,
    init: str,
    lloyd_iterations: int,
) -> list[MixtureDistribution]:
    """Each state's mixture, in two levels: k-means of the states (centres of the first
    state's component family) over every observation; then each state's own estimator
    started by k-means over the observations nearest the state's centre. States, and each
    state's components, are ordered by their means, so the labels do not depend on the draws."""
    centres_model = _mixture(
        kmeans_init(
            emissions,
            MixtureEstimator([states[0].estimators[0]] * len(states)),
            rng,
            exchange,
            init,
            lloyd_iterations=lloyd_iterations,
        )
    )
    centres = means_of(centres_model)
    centres = centres[lexicographic(centres)]
    rows = [encoded_points(e).cpu().numpy().T for e in emissions]
    labels = [nearest_centre(x, centres) for x in rows]
    started = []
    for state, estimator in enumerate(states):
        encoder = estimator.accumulator_factory().make().acc_to_encoder()
        members = [encoder.seq_encode(x[label == state]) for x, label in zip(rows, labels)]
        if exchange.sum(np.array([sum(len(m) for m in members)], dtype=np.float64))[0] == 0:
            raise ValueError(
                f"state {state} has no observations nearest its k-means centre (fewer distinct observations "
                "than states): fit fewer states, or start with init='random'"
            )
        mixture = _mixture(kmeans_init(members, estimator, rng, exchange, init, lloyd_iterations=lloyd_iterations))
        order = lexicographic(means_of(mixture))
        started.append(MixtureDistribution([mixture.components[i] for i in order], mixture.w[order]))
    return started


def means_of(mixture: MixtureDistribution) -> np.ndarray:
    """The (K, D) means of a mixture of Gaussian-family components."""
    return np.stack([np.atleast_1d(np.asarray(c.mu, dtype=np.float64)) for c in mixture.components])  # type: ignore[attr-defined]


def lexicographic(points: np.ndarray) -> np.ndarray:
    """The order of ``points`` (K, D) by their first coordinate, then their second, ...:
    labels that do not depend on k-means‖'s draws (which differ with the number of ranks)."""
    return np.lexsort(points.T[::-1])


def nearest_centre(rows: np.ndarray, centres: np.ndarray) -> np.ndarray:
    """Each row's nearest centre (squared distances about the first centre, so data far
    from zero keep their digits)."""
    shifted, origin = centres - centres[0], centres[0]
    lengths = (shifted * shifted).sum(axis=1)
    return np.argmin(lengths[None, :] - 2.0 * (rows - origin) @ shifted.T, axis=1)
