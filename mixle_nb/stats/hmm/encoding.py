"""Ragged sequences packed for a batched forward–backward.

An HMM's unit of data is a whole sequence. The encoding sorts a shard's sequences by length
(longest first) and cuts them into batches whose observations × states fit a budget; inside a
batch the observations are laid out time-major and packed, as ``torch.nn.utils.rnn``'s
``PackedSequence``: time step ``t`` holds one row for each of the ``sizes[t]`` sequences still
running, so one loop over time steps updates every sequence of the batch with no padding and
no masks. The emission encoding (any family's) is made once, over the packed rows.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np
import torch
from numpy.typing import ArrayLike

from ..base import Encoder, resolve_device
from ..estimation import encode

# Observations x states of one batch's lattices (forward, backward, emission terms: a few
# float64 arrays this size, 64 MB each at the default): larger batches pay the per-time-step
# overhead once for more sequences; the budget bounds the memory to O(batch x length x states).
BATCH_ELEMENTS = 1 << 23


@dataclass(frozen=True, eq=False)
class PackedBatch:
    """Sequences packed time-major for a batched forward–backward, as ``PackedSequence``.

    Time step ``t`` holds one row for each of the ``sizes[t]`` sequences still running, so one loop
    over time steps updates every sequence of the batch with no padding and no masks.

    Parameters
    ----------
    order : numpy.ndarray
        The batch's sequences, as indices into the shard, longest first.
    lengths : numpy.ndarray
        Their lengths.
    offsets : numpy.ndarray
        ``offsets[t]``: the first packed row of time step ``t``.
    sizes : numpy.ndarray
        ``sizes[t]``: the sequences still running at step ``t`` (non-increasing).
    emissions : encoding
        The emission family's encoding of the packed rows.
    rows : int
        The number of packed rows.
    previous : torch.Tensor or None
        Each row's predecessor (see :meth:`previous_rows`); ``None`` when every sequence has one
        length.
    starts : numpy.ndarray
        The batch's sequences' first rows in the shard's concatenated observations (each packed
        row's position there is its ``source`` property).
    segments : tuple
        The runs of steps with equal ``sizes``: ``(first column, steps, size)``.
    device : torch.device
        Where its tensors live.

    See Also
    --------
    SequenceEncoding, HiddenMarkovEncoder

    Examples
    --------
    >>> from mixle_nb.stats.gaussian import GaussianEncoder
    >>> from mixle_nb.stats.hmm import HiddenMarkovEncoder
    >>> batch = HiddenMarkovEncoder(GaussianEncoder(), 2).seq_encode([[0.0, 1.0, 2.0], [5.0]]).batches[0]
    >>> batch.order.tolist(), batch.sizes.tolist(), batch.offsets.tolist()
    ([0, 1], [2, 1, 1], [0, 2, 3])
    >>> batch.last_rows().tolist()
    [3, 1]
    """

    order: np.ndarray
    lengths: np.ndarray
    offsets: np.ndarray
    sizes: np.ndarray
    emissions: Any
    rows: int
    previous: torch.Tensor | None
    starts: np.ndarray
    segments: tuple
    device: torch.device

    @cached_property
    def source(self) -> np.ndarray:
        """Each packed row's position in the shard's concatenated observations, made on first
        use (decoding reads it; an E-step does not)."""
        return packed_source(self.starts, self.lengths, self.offsets, self.sizes)

    @cached_property
    def seq_of_row(self) -> torch.Tensor:
        """Each packed row's sequence within the batch (on the device), made on first use: the
        compiled scaled pass does not need it."""
        return torch.from_numpy(packed_sequences(self.offsets, self.sizes)).to(self.device)

    @property
    def batch(self) -> int:
        """The number of sequences in the batch."""
        return len(self.order)

    @property
    def steps(self) -> int:
        """The number of time steps (the longest sequence's length)."""
        return len(self.sizes)

    @property
    def equal_lengths(self) -> bool:
        """Whether every sequence of the batch has one length."""
        return bool(self.sizes[0] == self.sizes[-1])

    def previous_rows(self) -> slice | torch.Tensor:
        """For every row after time step 0, its sequence's row one step earlier.

        Returns
        -------
        slice or torch.Tensor
            A slice when all the batch's sequences have one length, else an index.
        """
        if self.previous is None:
            return slice(0, self.rows - self.batch)
        return self.previous

    def last_rows(self) -> np.ndarray:
        """Each sequence's row at its last time step.

        Returns
        -------
        numpy.ndarray
            One packed row per sequence, in batch order.
        """
        return self.offsets[self.lengths - 1] + np.arange(self.batch)


@dataclass(frozen=True, eq=False)
class SequenceEncoding:
    """A shard of sequences, packed in batches for the forward–backward.

    Parameters
    ----------
    batches : tuple of PackedBatch
        The batches, longest sequences first.
    count : int
        The number of sequences (``len()``).
    observations : int
        The number of observations, all sequences together.
    device : torch.device
        Where its tensors live.

    See Also
    --------
    HiddenMarkovEncoder : What makes it.

    Examples
    --------
    >>> from mixle_nb.stats.gaussian import GaussianEncoder
    >>> from mixle_nb.stats.hmm import HiddenMarkovEncoder
    >>> enc = HiddenMarkovEncoder(GaussianEncoder(), 2).seq_encode([[0.0, 1.0, 2.0], [5.0]])
    >>> len(enc), enc.observations, len(enc.batches)
    (2, 4, 1)
    """

    batches: tuple
    count: int
    observations: int
    device: torch.device

    def __len__(self) -> int:
        return self.count

    def first_sequence(self) -> tuple[PackedBatch, np.ndarray]:
        """The batch holding the shard's first sequence, and that sequence's packed rows in
        time order (its observations are ``batch.emissions`` at those rows)."""
        for batch in self.batches:
            where = np.flatnonzero(batch.order == 0)
            if where.size:
                column = int(where[0])
                return batch, batch.offsets[: int(batch.lengths[column])] + column
        raise ValueError("an encoding of no sequences has no first sequence")


def packed_sequences(offsets: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """Each packed row's sequence within its batch: step ``t`` holds sequences ``0 ..
    sizes[t] - 1``."""
    if sizes[0] == sizes[-1]:
        return np.tile(np.arange(sizes[0]), len(sizes))
    return np.arange(int(sizes.sum())) - np.repeat(offsets, sizes)


def packed_steps(lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For sequences sorted longest first: per time step the first packed row and the number of
    running sequences."""
    steps = int(lengths[0])
    # lengths are non-increasing: the sequences running at step t are those longer than t
    sizes = np.searchsorted(-lengths, -np.arange(steps), side="left")
    return np.concatenate([[0], np.cumsum(sizes)[:-1]]), sizes


def packed_source(starts: np.ndarray, lengths: np.ndarray, offsets: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """For sequences sorted longest first (their ``starts`` in the concatenated data): the
    concatenated row of each packed row. Sequences of one length are a ``(steps, batch)`` grid,
    built by broadcasting rather than by repeats."""
    steps = int(lengths[0])
    if lengths[-1] == steps:
        return (np.arange(steps)[:, None] + starts).reshape(-1)
    return starts[packed_sequences(offsets, sizes)] + np.repeat(np.arange(steps), sizes)


def packed_rows(
    x: np.ndarray, starts: np.ndarray, lengths: np.ndarray, offsets: np.ndarray, sizes: np.ndarray
) -> np.ndarray:
    """The batch's observations in packed order; when the batch's sequences have one length
    and lie one after another in ``x`` (as equal-length data does), as a transposed copy of
    their ``(batch, steps)`` block, several times faster than the gather (and with no index)."""
    steps, count = int(lengths[0]), len(lengths)
    first = int(starts[0])
    consecutive = lengths[-1] == steps and np.array_equal(starts, first + steps * np.arange(count))
    if not consecutive:
        return x[packed_source(starts, lengths, offsets, sizes)]
    grid = x[first : first + steps * count].reshape(count, steps, *x.shape[1:])
    return np.ascontiguousarray(grid.swapaxes(0, 1)).reshape(steps * count, *x.shape[1:])


def equal_size_runs(offsets: np.ndarray, sizes: np.ndarray) -> tuple:
    """``(first column, steps, running sequences)`` of each run of time steps with equal sizes."""
    runs, t = [], 0
    sizes_list = sizes.tolist()
    while t < len(sizes_list):
        end = t
        while end < len(sizes_list) and sizes_list[end] == sizes_list[t]:
            end += 1
        runs.append((int(offsets[t]), end - t, sizes_list[t]))
        t = end
    return tuple(runs)


def previous_index(sizes: np.ndarray, device: torch.device) -> torch.Tensor | None:
    """Row ``r`` at step ``t >= 1`` follows row ``r - sizes[t-1]``; ``None`` when every size is
    equal (the rows after step 0 then follow the first ``rows - batch`` rows, a slice)."""
    if sizes[0] == sizes[-1]:
        return None
    rows = np.arange(sizes[0], sizes.sum())
    return torch.from_numpy(rows - np.repeat(sizes[:-1], sizes[1:])).to(device)


def batch_bounds(sorted_lengths: np.ndarray, states: int, budget: int) -> list[tuple[int, int]]:
    """Cut sequences (longest first) into consecutive batches of at most ``budget``
    observations x states (a longer sequence alone is its own batch)."""
    bounds, start, used = [], 0, 0
    for i, n in enumerate(sorted_lengths):
        cost = int(n) * states
        if i > start and used + cost > budget:
            bounds.append((start, i))
            start, used = i, 0
        used += cost
    if len(sorted_lengths):
        bounds.append((start, len(sorted_lengths)))
    return bounds


class SequenceError(ValueError):
    """Bad input found in one sequence of an encoding: which one (``sequence``, counted within
    the data encoded), ``problem`` (what is wrong, as a clause) and ``fix``. Its text is the
    encoder's own; a handle names the sequence as the user numbers it, and the rank."""

    def __init__(self, sequence: int, problem: str, fix: str) -> None:
        super().__init__(f"sequence {sequence} {problem}: {fix}")
        self.sequence, self.problem, self.fix = sequence, problem, fix


def locate_non_finite(x: np.ndarray, lengths: np.ndarray) -> str | None:
    """``"sequence s, position p"`` of the first NaN or infinite observation, else ``None``.
    A finite sum (one pass, no temporary) proves every value finite; only a sum that is not
    (a bad value, or finite values that overflow it) looks value by value."""
    if x.dtype.kind not in "fc":
        return None
    with np.errstate(over="ignore", invalid="ignore"):
        if np.isfinite(x.sum()) or np.all(np.isfinite(x)):
            return None
    row = int(np.flatnonzero(~np.isfinite(x.reshape(len(x), -1)).all(axis=1))[0])
    ends = np.cumsum(lengths)
    seq = int(np.searchsorted(ends, row, side="right"))
    return f"sequence {seq}, position {row - (ends[seq] - lengths[seq])}"


class HiddenMarkovEncoder(Encoder):
    """Encodes sequences for an HMM whose states emit from ``emission_encoder``'s family.

    Parameters
    ----------
    emission_encoder : Encoder
        The emission family's encoder (it encodes the packed observations of each batch).
    states : int
        Number of states: sizes the batches with ``batch_elements``.
    batch_elements : int, optional
        Observations x states of one batch (default ``BATCH_ELEMENTS``, 2**23).

    Raises
    ------
    ValueError
        (from the encoding methods) a sequence of length 0, lengths that do not sum to the
        observations, or a NaN or infinite value, named by sequence and position.

    Examples
    --------
    >>> from mixle_nb.stats.gaussian import GaussianEncoder
    >>> from mixle_nb.stats.hmm import HiddenMarkovEncoder
    >>> enc = HiddenMarkovEncoder(GaussianEncoder(), 2).seq_encode([[0.0, 1.0, 2.0], [5.0]])
    >>> enc.count, enc.observations, enc.batches[0].sizes.tolist()
    (2, 4, [2, 1, 1])
    """

    def __init__(self, emission_encoder: Any, states: int = 1, batch_elements: int | None = None):
        self.emission_encoder, self.states = emission_encoder, states
        self.batch_elements = batch_elements

    def row_count(self, enc: SequenceEncoding) -> int:
        """The number of sequences in an encoding (what a handle counts).

        Parameters
        ----------
        enc : SequenceEncoding
            An encoding of this encoder.

        Returns
        -------
        int
            Its sequence count.
        """
        return enc.count

    def seq_encode(self, data: Any, device: Any = None) -> SequenceEncoding:
        """Encode a list of sequences.

        Parameters
        ----------
        data : sequence of array_like
            The sequences, each an array-like of observations.
        device : str or torch.device, optional
            Where the encoding lives (``None``: the CPU).

        Returns
        -------
        SequenceEncoding
            The packed batches.

        Raises
        ------
        ValueError
            An empty sequence, or a NaN or infinite value (named by sequence and position).
        """
        seqs = [np.asarray(s) for s in data]
        lengths = np.array([len(s) for s in seqs], dtype=np.int64)
        x = np.concatenate(seqs) if seqs else np.zeros(0)
        return self.encode_concatenated(x, lengths, device)

    def encode_concatenated(self, x: ArrayLike, lengths: ArrayLike, device: Any = None) -> SequenceEncoding:
        """Encode sequences given as their concatenation and their lengths (hmmlearn's form).

        Parameters
        ----------
        x : array_like
            Every sequence's observations, one after another.
        lengths : array_like of int
            Each sequence's length.
        device : str or torch.device, optional
            Where the encoding lives (``None``: the CPU).

        Returns
        -------
        SequenceEncoding
            The packed batches.

        Raises
        ------
        ValueError
            A length of 0, lengths that do not sum to the observations, or a NaN or infinite value
            (named by sequence and position).

        Examples
        --------
        >>> import numpy as np
        >>> from mixle_nb.stats.gaussian import GaussianEncoder
        >>> from mixle_nb.stats.hmm import HiddenMarkovEncoder
        >>> enc = HiddenMarkovEncoder(GaussianEncoder(), 2).encode_concatenated(np.array([0.1, 4.9, 5.2, 0.0]), [3, 1])
        >>> len(enc), enc.observations
        (2, 4)
        """
        x = np.asarray(x)
        lengths = np.asarray(lengths, dtype=np.int64).reshape(-1)
        device = resolve_device(device)
        if np.any(lengths <= 0):
            bad = int(np.flatnonzero(lengths <= 0)[0])
            raise SequenceError(
                bad, f"has length {int(lengths[bad])}", "every sequence needs at least one observation; drop it"
            )
        if int(lengths.sum()) != len(x):
            raise ValueError(f"lengths array {lengths} doesn't sum to {len(x)} samples")
        where = locate_non_finite(x, lengths)
        if where is not None:
            raise ValueError(f"{where} is NaN or infinite; drop or impute it first")
        starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
        order = np.argsort(-lengths, kind="stable")
        budget = self.batch_elements or BATCH_ELEMENTS
        batches = []
        for lo, hi in batch_bounds(lengths[order], max(self.states, 1), budget):
            members = order[lo:hi]
            member_starts, member_lengths = starts[members], lengths[members]
            offsets, sizes = packed_steps(member_lengths)
            packed = packed_rows(x, member_starts, member_lengths, offsets, sizes)
            batches.append(
                PackedBatch(
                    order=members,
                    lengths=member_lengths,
                    offsets=offsets,
                    sizes=sizes,
                    emissions=encode(self.emission_encoder, packed, device),
                    rows=len(packed),
                    previous=previous_index(sizes, device),
                    starts=member_starts,
                    segments=equal_size_runs(offsets, sizes),
                    device=device,
                )
            )
        return SequenceEncoding(tuple(batches), len(lengths), int(lengths.sum()), device)


def symbol_report(enc: SequenceEncoding, n_symbols: int) -> np.ndarray:
    """Per sequence of an encoding of categorical emissions (in the encoding's sequence order):
    the first position whose symbol is not an integer in ``[0, n_symbols)`` (-1: none), the
    symbol there, and the sequence's largest symbol.

    Parameters
    ----------
    enc : SequenceEncoding
        Sequences encoded with a categorical emission encoder (labels and their index).
    n_symbols : int
        The number of symbols the model emits.

    Returns
    -------
    numpy.ndarray
        Shape ``(len(enc), 3)``, float64.

    Raises
    ------
    ValueError
        Symbols that are not numbers.
    """
    out = np.zeros((enc.count, 3))
    for batch in enc.batches:
        labels = np.asarray(batch.emissions.labels)
        if labels.dtype.kind not in "biuf":
            raise ValueError(f"Symbols should be integers; got labels of dtype {labels.dtype}")
        symbols = labels.astype(np.float64)[batch.emissions.index.cpu().numpy()]
        steps = np.repeat(np.arange(batch.steps), batch.sizes)
        column = batch.seq_of_row.cpu().numpy()
        bad = (symbols != np.round(symbols)) | (symbols < 0) | (symbols >= n_symbols)
        first = np.full(batch.batch, batch.steps)
        np.minimum.at(first, column[bad], steps[bad])
        largest = np.full(batch.batch, -np.inf)
        np.maximum.at(largest, column, symbols)
        hit = first < batch.steps
        out[batch.order, 0] = np.where(hit, first, -1)
        out[batch.order, 1] = symbols[batch.offsets[np.where(hit, first, 0)] + np.arange(batch.batch)]
        out[batch.order, 2] = largest
    return out
