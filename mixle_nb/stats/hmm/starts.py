"""k-means starts for an HMM's emissions: k-means‖ (or random observations) over every
sequence's observations, as for a mixture of the states' families, then hmmlearn's chain start
(uniform start and transition probabilities)."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..kmeans import Exchange, kmeans_init
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
    mixture = kmeans_init(
        emissions, MixtureEstimator(estimator.estimators), rng, exchange, init, lloyd_iterations=lloyd_iterations
    )
    assert isinstance(mixture, MixtureDistribution)  # kmeans_init estimates the mixture given
    k = len(estimator.estimators)
    return HiddenMarkovDistribution(
        mixture.components, np.full(k, 1.0 / k), np.full((k, k), 1.0 / k), estimator.implementation
    )
