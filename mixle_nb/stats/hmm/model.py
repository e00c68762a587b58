"""The hidden Markov model family: distribution, estimator and accumulator.

An observation of this family is a whole sequence; a shard is a set of sequences
(:class:`.encoding.SequenceEncoding`). The statistics are plain sums (expected starts,
expected transitions, each state's occupancy and its emission family's own statistics
weighted by the state posteriors), so values combine in any order across chunks and ranks and
the fold, logical shards and checkpoints work unchanged.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from numpy.typing import ArrayLike

from .. import foreign
from ..base import Accumulator, Distribution, Estimator, device_tensor, merge_into, random_source, resident
from ..centred_moments import DegenerateComponentError
from ..sampler import Sampler
from .decoding import viterbi
from .emissions import EmissionKernel, add_emission_statistics, compiled_source, compiled_statistics
from .encoding import HiddenMarkovEncoder, PackedBatch, SequenceEncoding
from .forward_backward import IMPLEMENTATIONS, BatchPosteriors, compiled_scaled, forward_backward


def stochastic_rows(matrix: np.ndarray, name: str, allow_zero_rows: bool = False) -> np.ndarray:
    """``matrix`` (..., K) checked finite, >= 0, each row summing to 1 (or, when allowed, 0)."""
    sums = matrix.sum(axis=-1)
    ok = np.isclose(sums, 1.0, rtol=0, atol=1e-8) | (allow_zero_rows & (sums == 0))
    if not (np.all(np.isfinite(matrix)) and np.all(matrix >= 0) and np.all(ok)):
        raise ValueError(f"{name} must be finite, >= 0 and sum to 1 along its last axis; its sums are {sums}")
    return matrix


class HiddenMarkovDistribution(Distribution):
    """A hidden Markov model: states ``0..K-1``, each emitting from its own distribution.

    Parameters
    ----------
    emissions : sequence of Distribution
        State k's emission distribution (any family of ours, or mixle's; one encoding shared).
    startprob : array-like, shape (K,)
        Probabilities of the first state, summing to 1.
    transmat : array-like, shape (K, K)
        Transition probabilities, rows summing to 1 (a row of zeros: a state with no way on,
        as a fit leaves a state that was never left).
    implementation : {"log", "scaling"}
        The forward–backward arithmetic.
    length : int, optional
        Length of the sequences :meth:`sampler` draws.

    Raises
    ------
    ValueError
        No states, shapes that disagree, probabilities that are not stochastic, or an
        unknown ``implementation``.

    Examples
    --------
    >>> from mixle_nb.stats import GaussianDistribution
    >>> from mixle_nb.stats.hmm import HiddenMarkovDistribution
    >>> hmm = HiddenMarkovDistribution(
    ...     [GaussianDistribution(0.0, 1.0), GaussianDistribution(5.0, 1.0)], [0.5, 0.5], [[0.9, 0.1], [0.2, 0.8]]
    ... )
    >>> round(hmm.log_density([0.1, 4.9, 5.2]), 3)
    -6.006
    """

    def __init__(
        self,
        emissions: Sequence[Any],
        startprob: ArrayLike,
        transmat: ArrayLike,
        implementation: str = "log",
        length: int | None = None,
    ) -> None:
        self.emissions: list[Any] = list(emissions)
        k = len(self.emissions)
        if k == 0:
            raise ValueError("a hidden Markov model needs at least one state")
        self.startprob = stochastic_rows(np.asarray(startprob, dtype=np.float64).reshape(-1), "startprob")
        self.transmat = stochastic_rows(np.asarray(transmat, dtype=np.float64), "transmat", allow_zero_rows=True)
        if self.startprob.shape != (k,) or self.transmat.shape != (k, k):
            raise ValueError(
                f"{k} states need startprob ({k},) and transmat ({k}, {k}); "
                f"got {self.startprob.shape} and {self.transmat.shape}"
            )
        if implementation not in IMPLEMENTATIONS:
            raise ValueError(f"implementation must be one of {IMPLEMENTATIONS}; got {implementation!r}")
        self.implementation, self.length = implementation, length
        self._on: dict = {}
        self._kernel: EmissionKernel | None = None

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_on": {}, "_kernel": None}

    def __repr__(self) -> str:
        return (
            f"HiddenMarkovDistribution({self.emissions!r}, startprob={self.startprob.tolist()}, "
            f"transmat={self.transmat.tolist()}, implementation={self.implementation!r})"
        )

    @property
    def n_states(self) -> int:
        """The number of states K."""
        return len(self.emissions)

    def parameters_on(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """``startprob`` and ``transmat`` as float64 tensors on a device, copied there once.

        Parameters
        ----------
        device : torch.device
            Where the forward–backward runs.

        Returns
        -------
        startprob : torch.Tensor
            ``(K,)``.
        transmat : torch.Tensor
            ``(K, K)``.
        """
        found = self._on.get(device)
        if found is None:
            found = self._on[device] = (
                torch.from_numpy(self.startprob.copy()).to(device),
                torch.from_numpy(self.transmat.copy()).to(device),
            )
        return found

    def emission_kernel(self) -> EmissionKernel:
        """The batched emission kernel of the states (built once, then kept).

        Returns
        -------
        EmissionKernel
            What computes every state's emission log-likelihoods of a batch at once.
        """
        if self._kernel is None:
            self._kernel = EmissionKernel(self.emissions)
        return self._kernel

    def log_b(self, batch: PackedBatch) -> tuple[torch.Tensor, Any]:
        """A batch's emission log-likelihoods, every state and row.

        Parameters
        ----------
        batch : PackedBatch
            A batch of a :class:`SequenceEncoding`.

        Returns
        -------
        log_b : torch.Tensor
            ``(K, rows)`` emission log-likelihoods.
        terms : object
            What the kernel computed on the way that the emission accumulators reuse (or ``None``).
        """
        return self.emission_kernel()(batch.emissions)

    def device_log_density(self, enc: SequenceEncoding) -> torch.Tensor:
        """Each sequence's log-likelihood (forward pass only), in the shard's order.

        Parameters
        ----------
        enc : SequenceEncoding
            The encoded sequences.

        Returns
        -------
        torch.Tensor
            ``(count,)`` float64, on the encoding's device.
        """
        out = torch.empty(enc.count, dtype=torch.float64, device=enc.device)
        for batch in enc.batches:
            startprob, transmat = self.parameters_on(enc.device)
            result = forward_backward(
                batch, self.log_b(batch)[0], startprob, transmat, self.implementation, posteriors=False
            )
            out[torch.from_numpy(batch.order).to(enc.device)] = result.log_likelihood
        return out

    def seq_posteriors(self, enc: SequenceEncoding) -> tuple[np.ndarray, np.ndarray]:
        """Each sequence's log-likelihood and each observation's state posteriors.

        Parameters
        ----------
        enc : SequenceEncoding
            The encoded sequences.

        Returns
        -------
        log_likelihood : numpy.ndarray
            ``(count,)``, in the shard's order.
        posteriors : numpy.ndarray
            ``(observations, K)``, in the shard's order, each row summing to 1.

        Examples
        --------
        >>> from mixle_nb.stats import GaussianDistribution
        >>> from mixle_nb.stats.hmm import HiddenMarkovDistribution
        >>> hmm = HiddenMarkovDistribution(
        ...     [GaussianDistribution(0.0, 1.0), GaussianDistribution(5.0, 1.0)], [0.5, 0.5], [[0.9, 0.1], [0.2, 0.8]]
        ... )
        >>> log_likelihood, posteriors = hmm.seq_posteriors(hmm.dist_to_encoder().seq_encode([[0.1, 4.9, 5.2], [0.0]]))
        >>> posteriors.argmax(axis=1).tolist()
        [0, 1, 1, 0]
        """
        ll = np.empty(enc.count)
        post = np.empty((enc.observations, self.n_states))
        for batch in enc.batches:
            startprob, transmat = self.parameters_on(enc.device)
            result = forward_backward(batch, self.log_b(batch)[0], startprob, transmat, self.implementation)
            assert result.gamma is not None
            gamma = result.gamma / result.gamma.sum(dim=0, keepdim=True)
            ll[batch.order] = result.log_likelihood.cpu().numpy()
            post[batch.source] = gamma.T.cpu().numpy()
        return ll, post

    def seq_viterbi(self, enc: SequenceEncoding) -> tuple[np.ndarray, np.ndarray]:
        """Each sequence's most likely state path (Viterbi).

        Parameters
        ----------
        enc : SequenceEncoding
            The encoded sequences.

        Returns
        -------
        log_probability : numpy.ndarray
            ``(count,)``: each path's log-probability, in the shard's order.
        states : numpy.ndarray
            ``(observations,)``: the states, in the shard's order.

        Examples
        --------
        >>> from mixle_nb.stats import GaussianDistribution
        >>> from mixle_nb.stats.hmm import HiddenMarkovDistribution
        >>> hmm = HiddenMarkovDistribution(
        ...     [GaussianDistribution(0.0, 1.0), GaussianDistribution(5.0, 1.0)], [0.5, 0.5], [[0.9, 0.1], [0.2, 0.8]]
        ... )
        >>> log_probability, states = hmm.seq_viterbi(hmm.dist_to_encoder().seq_encode([[0.1, 4.9, 5.2], [0.0]]))
        >>> states.tolist()
        [0, 1, 1, 0]
        """
        log_prob = np.empty(enc.count)
        states = np.empty(enc.observations, dtype=np.int64)
        for batch in enc.batches:
            startprob, transmat = self.parameters_on(enc.device)
            best, path = viterbi(batch, self.log_b(batch)[0], startprob, transmat)
            log_prob[batch.order] = best.cpu().numpy()
            states[batch.source] = path.cpu().numpy()
        return log_prob, states

    def dist_to_encoder(self) -> HiddenMarkovEncoder:
        return HiddenMarkovEncoder(self.emissions[0].dist_to_encoder(), self.n_states)

    def estimator(self, **kwargs: Any) -> HiddenMarkovEstimator:
        kwargs.setdefault("implementation", self.implementation)
        return HiddenMarkovEstimator([e.estimator() for e in self.emissions], **kwargs)

    def sample_sequence(
        self, rng: np.random.Generator, length: int, state: int | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """One sequence and its states.

        Parameters
        ----------
        rng : numpy.random.Generator
            The random source.
        length : int
            The number of observations.
        state : int, optional
            The first state (default: drawn from ``startprob``).

        Returns
        -------
        observations : numpy.ndarray
            ``length`` observations.
        states : numpy.ndarray
            The state of each.
        """
        rng = random_source(rng)
        states = np.empty(length, dtype=np.int64)
        current = int(rng.choice(self.n_states, p=self.startprob)) if state is None else int(state)
        for t in range(length):
            if t:
                current = int(rng.choice(self.n_states, p=self.transmat[current]))
            states[t] = current
        counts = np.bincount(states, minlength=self.n_states)
        drawn = [foreign.draw(e, rng, int(c)) for e, c in zip(self.emissions, counts)]
        sample = np.empty((length,) + np.shape(drawn[int(states[0])])[1:], dtype=np.result_type(*drawn))
        for k, values in enumerate(drawn):
            sample[states == k] = values
        return sample, states

    def draw(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """Draw ``n`` sequences of ``length`` observations.

        Parameters
        ----------
        rng : numpy.random.Generator
            The random source.
        n : int
            How many sequences.

        Returns
        -------
        numpy.ndarray
            An object array of ``n`` arrays.

        Raises
        ------
        ValueError
            The model was built without ``length``.
        """
        if self.length is None:
            raise ValueError("sampling whole sequences needs their length: HiddenMarkovDistribution(..., length=T)")
        out = np.empty(n, dtype=object)
        for i in range(n):
            out[i] = self.sample_sequence(rng, self.length)[0]
        return out

    def sampler(self, seed: Any = None) -> Sampler:
        """A sampler drawing whole sequences of ``length`` observations.

        Parameters
        ----------
        seed : int or numpy.random.SeedSequence, optional
            The seed of its random source.

        Returns
        -------
        Sampler
            ``sample(n)`` draws ``n`` sequences; ``sample()`` one.
        """
        return Sampler(self.draw, seed)


class HiddenMarkovAccumulator(Accumulator):
    """Expected starts, transitions and state occupancies, plus one emission accumulator per state.

    Parameters
    ----------
    accumulators : list of Accumulator
        One emission accumulator per state.
    keys : str, optional
        Ties the start and transition counts across models with the same key.

    See Also
    --------
    HiddenMarkovEstimator : Makes it and estimates from its value.

    Examples
    --------
    >>> from mixle_nb.stats import GaussianDistribution
    >>> from mixle_nb.stats.hmm import HiddenMarkovDistribution
    >>> hmm = HiddenMarkovDistribution(
    ...     [GaussianDistribution(0.0, 1.0), GaussianDistribution(5.0, 1.0)], [0.5, 0.5], [[0.9, 0.1], [0.2, 0.8]]
    ... )
    >>> acc = hmm.estimator().accumulator_factory().make()
    >>> log_likelihood = acc.seq_update(hmm.dist_to_encoder().seq_encode([[0.1, 4.9, 5.2], [0.0]]), None, hmm)
    >>> acc.occupancy.round(3).tolist(), acc.transitions.sum().round(3)
    ([2.0, 2.0], np.float64(2.0))
    """

    def __init__(self, accumulators: list, keys: str | None = None):
        k = len(accumulators)
        self.accumulators, self.keys = accumulators, keys
        self.start, self.transitions, self.occupancy = np.zeros(k), np.zeros((k, k)), np.zeros(k)

    def seq_update(
        self, enc: SequenceEncoding, weights: np.ndarray | torch.Tensor | None, model: HiddenMarkovDistribution
    ) -> np.ndarray | torch.Tensor:
        """The E-step on every batch: add the expected counts under ``model``.

        Parameters
        ----------
        enc : SequenceEncoding
            The encoded sequences.
        weights : numpy.ndarray or torch.Tensor or None
            One weight per sequence (``None``: 1 each).
        model : HiddenMarkovDistribution
            The model the E-step runs under.

        Returns
        -------
        numpy.ndarray or torch.Tensor
            Each sequence's log-likelihood under ``model``.
        """
        out = torch.empty(enc.count, dtype=torch.float64, device=enc.device)
        w_all = None if weights is None else device_tensor(weights, enc.device)
        startprob, transmat = model.parameters_on(enc.device)
        for batch in enc.batches:
            order = torch.from_numpy(batch.order).to(enc.device)
            w = None if w_all is None else w_all[order]
            result = self._compiled_batch(batch, w, model) or self._batch(batch, w, model)
            start, transitions = result.start, result.transitions
            assert start is not None and transitions is not None
            start_counts, transition_counts = start.cpu().numpy(), transitions.cpu().numpy()
            # each step after the first enters its state by one transition: Σ_i ξ_t(i, s) = γ_t(s), so
            # the expected occupancy is the starts plus the transitions into each state, with no
            # pass over the (K, rows) posteriors
            self.occupancy += start_counts + transition_counts.sum(axis=0)
            self.start += start_counts
            self.transitions += transition_counts
            out[order] = result.log_likelihood
        return resident(out)

    def _batch(self, batch: PackedBatch, w: torch.Tensor | None, model: HiddenMarkovDistribution) -> BatchPosteriors:
        """One batch's E-step: the forward–backward's posteriors handed to the emission accumulators."""
        log_b, terms = model.log_b(batch)
        result = forward_backward(batch, log_b, *model.parameters_on(batch.device), model.implementation, w)
        assert result.gamma is not None
        add_emission_statistics(self.accumulators, batch.emissions, result.gamma, model.emissions, terms)
        return result

    def _compiled_batch(
        self, batch: PackedBatch, w: torch.Tensor | None, model: HiddenMarkovDistribution
    ) -> BatchPosteriors | None:
        """One batch's E-step in the compiled scaled pass, the emission terms and statistics
        made inside it (:mod:`.scaled_kernel`); ``None`` where it does not apply."""
        if model.implementation != "scaling" or batch.device.type != "cpu":
            return None
        source = compiled_source(model.emissions, batch.emissions)
        if source is None:
            return None
        statistics = compiled_statistics(self.accumulators, *source, batch.emissions)
        if statistics is None:
            return None
        target, values, hand_over = statistics
        log_likelihood, start, transitions = compiled_scaled(
            batch, *source, target, values, *model.parameters_on(batch.device), w
        )
        hand_over()
        return BatchPosteriors(
            torch.from_numpy(log_likelihood), start=torch.from_numpy(start), transitions=torch.from_numpy(transitions)
        )

    def seq_initialize(
        self, enc: SequenceEncoding, weights: np.ndarray | torch.Tensor | None, rng: np.random.Generator
    ) -> None:
        """A random start: random posteriors, with transitions counted between them.

        Each observation is mostly one state's (a sparse Dirichlet, as a mixture's random start);
        transitions are counted between consecutive posteriors.

        Parameters
        ----------
        enc : SequenceEncoding
            The encoded sequences.
        weights : numpy.ndarray or None
            One weight per sequence (``None``: 1 each).
        rng : numpy.random.Generator
            The random source.
        """
        k = len(self.accumulators)
        w_all = np.ones(enc.count) if weights is None else np.asarray(weights, dtype=np.float64)
        for batch in enc.batches:
            gamma = torch.from_numpy(rng.dirichlet(np.full(k, 1.0 / (k * k)), size=batch.rows)).to(enc.device)
            row_w = torch.from_numpy(w_all[batch.order]).to(enc.device)[batch.seq_of_row]
            n0 = int(batch.sizes[0])
            after = gamma[n0:] * row_w[n0:, None]
            self.transitions += torch.mm(gamma[batch.previous_rows()].T, after).cpu().numpy()
            gamma = gamma * row_w[:, None]
            self.start += gamma[:n0].sum(dim=0).cpu().numpy()
            resp = gamma.T.contiguous()  # (K, rows), as the E-step's posteriors
            self.occupancy += resp.sum(dim=1).cpu().numpy()
            for acc, row in zip(self.accumulators, resp.cpu().numpy()):
                acc.seq_initialize(batch.emissions, row, rng)

    def value(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, list]:
        return self.start.copy(), self.transitions.copy(), self.occupancy.copy(), [a.value() for a in self.accumulators]

    def from_value(self, value: Any) -> HiddenMarkovAccumulator:
        start, transitions, occupancy, values = value
        self.start = np.array(start, dtype=np.float64)
        self.transitions = np.array(transitions, dtype=np.float64)
        self.occupancy = np.array(occupancy, dtype=np.float64)
        for acc, v in zip(self.accumulators, values):
            acc.from_value(v)
        return self

    def combine(self, value: Any) -> HiddenMarkovAccumulator:
        start, transitions, occupancy, values = value
        self.start += start
        self.transitions += transitions
        self.occupancy += occupancy
        for acc, v in zip(self.accumulators, values):
            acc.combine(v)
        return self

    def key_merge(self, stats: dict) -> None:
        if self.keys is not None:
            merge_into(stats, self.keys, np.concatenate([self.start, self.transitions.reshape(-1)]))
        for acc in self.accumulators:
            acc.key_merge(stats)

    def key_replace(self, stats: dict) -> None:
        if self.keys is not None:
            merged = stats[self.keys].value()
            k = len(self.start)
            self.start, self.transitions = merged[:k], merged[k:].reshape(k, k)
        for acc in self.accumulators:
            acc.key_replace(stats)

    def acc_to_encoder(self) -> HiddenMarkovEncoder:
        return HiddenMarkovEncoder(self.accumulators[0].acc_to_encoder(), len(self.accumulators))


def normalized_rows(counts: np.ndarray) -> np.ndarray:
    """Rows divided by their sums; a row summing to 0 stays 0 (hmmlearn's ``normalize``)."""
    sums = counts.sum(axis=-1, keepdims=True)
    with np.errstate(under="ignore"):
        return counts / np.where(sums == 0, 1.0, sums)


class HiddenMarkovEstimator(Estimator):
    """M-step for an HMM whose state k emits from ``estimators[k]``'s family.

    Parameters
    ----------
    estimators : sequence of Estimator
        One emission estimator per state.
    startprob_prior, transmat_prior : float or array-like
        Dirichlet concentrations (hmmlearn's: the new probabilities are ``max(prior - 1 +
        expected counts, 0)``, normalised; 1 is maximum likelihood).
    implementation : {"log", "scaling"}
        The new model's forward–backward arithmetic.
    keys : str, optional
        Ties the start and transition counts across HMMs with the same key.

    Raises
    ------
    ValueError
        No estimators or an unknown ``implementation``;
        :class:`~mixle_nb.stats.DegenerateComponentError` (from :meth:`estimate`) naming the
        state whose emission cannot be estimated.

    Examples
    --------
    >>> from mixle_nb.stats import GaussianEstimator, em_step, seq_encode
    >>> from mixle_nb.stats import GaussianDistribution
    >>> from mixle_nb.stats.hmm import HiddenMarkovDistribution, HiddenMarkovEstimator
    >>> start = HiddenMarkovDistribution(
    ...     [GaussianDistribution(0.0, 1.0), GaussianDistribution(3.0, 1.0)], [0.5, 0.5], [[0.8, 0.2], [0.2, 0.8]]
    ... )
    >>> estimator = HiddenMarkovEstimator([GaussianEstimator(), GaussianEstimator()])
    >>> enc = seq_encode([[0.1, 0.2, 3.1], [2.9, 3.2]], model=start)
    >>> em_step(enc, estimator, start).count
    2.0
    """

    def __init__(
        self,
        estimators: Sequence[Estimator],
        startprob_prior: float | np.ndarray = 1.0,
        transmat_prior: float | np.ndarray = 1.0,
        implementation: str = "log",
        keys: str | None = None,
    ) -> None:
        self.estimators = list(estimators)
        if not self.estimators:
            raise ValueError("HiddenMarkovEstimator needs one emission estimator per state")
        if implementation not in IMPLEMENTATIONS:
            raise ValueError(f"implementation must be one of {IMPLEMENTATIONS}; got {implementation!r}")
        self.startprob_prior, self.transmat_prior = startprob_prior, transmat_prior
        self.implementation, self.keys = implementation, keys

    def make_accumulator(self) -> HiddenMarkovAccumulator:
        return HiddenMarkovAccumulator([foreign.accumulator(e) for e in self.estimators], self.keys)

    def estimate_emissions(self, occupancy: np.ndarray, values: list) -> list:
        """Each state's emission model from its statistics.

        A subclass may estimate them together.

        Parameters
        ----------
        occupancy : numpy.ndarray
            ``(K,)`` expected observations per state.
        values : list
            Each state's emission accumulator value.

        Returns
        -------
        list of Distribution
            One emission model per state.

        Raises
        ------
        DegenerateComponentError
            Naming the state whose emission cannot be estimated.
        """
        emissions = []
        for k, (e, n, v) in enumerate(zip(self.estimators, occupancy, values)):
            try:
                emissions.append(e.estimate(n, v))
            except DegenerateComponentError as error:
                raise DegenerateComponentError(f"state {k} of {len(self.estimators)} {error}") from None
        return emissions

    def estimate(self, nobs: float | None, value: Any) -> HiddenMarkovDistribution:
        start, transitions, occupancy, values = value
        startprob = normalized_rows(np.maximum(np.asarray(self.startprob_prior) - 1.0 + start, 0.0))
        transmat = normalized_rows(np.maximum(np.asarray(self.transmat_prior) - 1.0 + transitions, 0.0))
        if startprob.sum() == 0:
            startprob = np.full(len(start), 1.0 / len(start))
        return HiddenMarkovDistribution(
            self.estimate_emissions(occupancy, values), startprob, transmat, self.implementation
        )

    def free_parameters(self, model: Distribution, count: Any) -> int:
        """How many free parameters ``model`` has as this estimator fits it.

        ``K - 1`` start and ``K(K - 1)`` transition probabilities, and each state's emission.

        Parameters
        ----------
        model : HiddenMarkovDistribution
            A fitted model.
        count : ParameterCount
            The count in progress (which keys were counted already).

        Returns
        -------
        int
            The number of free parameters.
        """
        assert isinstance(model, HiddenMarkovDistribution)
        k = model.n_states
        chain = 0 if count.tied("chain", self.keys) else (k - 1) + k * (k - 1)
        return chain + sum(count.of(e, m) for e, m in zip(self.estimators, model.emissions))


def states_of_copies(estimator: HiddenMarkovEstimator, k: int) -> HiddenMarkovEstimator:
    """An HMM estimator of ``k`` states, each emitting from a copy of ``estimator``'s first
    state's family (as ``stats.mixture.mixture_of_copies`` for mixtures), with
    its arithmetic; what choosing the number of states fits.

    Parameters
    ----------
    estimator : HiddenMarkovEstimator
        The HMM family whose first emission estimator is copied.
    k : int
        The number of states.

    Returns
    -------
    HiddenMarkovEstimator
        ``k`` states, maximum-likelihood start and transitions.

    Examples
    --------
    >>> from mixle_nb.stats import GaussianEstimator
    >>> len(states_of_copies(HiddenMarkovEstimator([GaussianEstimator()]), 3).estimators)
    3
    """
    return HiddenMarkovEstimator([estimator.estimators[0]] * k, implementation=estimator.implementation)


__all__ = [
    "HiddenMarkovAccumulator",
    "HiddenMarkovDistribution",
    "HiddenMarkovEstimator",
    "normalized_rows",
    "states_of_copies",
    "stochastic_rows",
]
