"""Next-token training windows streamed straight from a token array.

Two schedules over the same strided view of ``block + 1``-token windows:

- **sequences** (what training uses, :func:`stream_sequence_source`): windows start every
  ``block`` tokens, at an offset in ``[0, block)`` drawn per epoch when shuffling, and yield
  ``(inputs (b, block), targets (b, block))`` with ``targets`` the inputs shifted by one. The
  loss is taken at every position, so an epoch predicts each token about once.
- **single targets** (the reference's, :func:`stream_token_source`): a window starts at every
  position and yields ``(context (b, block), next token (b,))``; an epoch predicts each token
  once but runs ``block`` times as many windows through the model.

A batch is one gather of ``(batch, block + 1)`` rows, so resident memory is the token array, one
batch, and one chunk of at most 16k window offsets. The shuffled order is a keyed bijection of
the window indices (add / xor-shift / odd-multiply rounds with cycle walking) evaluated a chunk
at a time, so no permutation of length N is ever stored.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view
from numpy.typing import ArrayLike

_SCRAMBLE_ROUNDS = 4
_CHUNK_WINDOWS = 16_384


def as_token_array(token_ids: ArrayLike, *, check_values: bool = True) -> np.ndarray:
    """Validate ``token_ids`` as a 1-D array of non-negative integers (no copy if already one).

    ``check_values=False`` checks only shape and dtype, reading no ids (for a memory map whose
    ids each rank checks on its own part)."""
    tokens = np.asarray(token_ids)
    if tokens.ndim != 1:
        raise ValueError(f"token_ids must be 1-D, got shape {tokens.shape}; flatten the token stream")
    if tokens.dtype == bool or not np.issubdtype(tokens.dtype, np.integer):
        raise TypeError(
            f"token_ids must hold integers, got dtype {tokens.dtype}; "
            "encode text to ids first (e.g. CharTokenizer.encode)"
        )
    if check_values and tokens.size and np.issubdtype(tokens.dtype, np.signedinteger) and tokens.min() < 0:
        raise ValueError("token_ids contain negative ids; ids must lie in [0, vocab)")
    return tokens


def permuted_indices(positions: np.ndarray, n: int, keys: np.ndarray) -> np.ndarray:
    """Image of ``positions`` (in ``[0, n)``) under a bijection of ``[0, n)`` keyed by ``keys``."""
    bits = max(1, (n - 1).bit_length())
    mask, shift = np.uint64((1 << bits) - 1), np.uint64(max(1, bits // 2))

    def scramble(x: np.ndarray) -> np.ndarray:
        # Each step is a bijection of [0, 2**bits): add a key, xor-shift right, multiply by an
        # odd number (all mod 2**bits). Rounds of them spread every input bit over the output.
        for key in keys:
            x += key
            x &= mask
            x ^= x >> shift
            x *= key | np.uint64(1)
            x &= mask
            x ^= x >> shift
        return x

    # 2**bits < 2n, so re-scrambling the values that land outside [0, n) (cycle walking)
    # restricts the bijection to [0, n) in under two passes on average.
    out = scramble(positions.astype(np.uint64))
    outside = out >= n
    while outside.any():
        out[outside] = scramble(out[outside])
        outside = out >= n
    return out.astype(np.int64)


def epoch_keys(seed: int, epoch: int) -> np.ndarray:
    return np.random.SeedSequence([seed, epoch]).generate_state(_SCRAMBLE_ROUNDS, dtype=np.uint64)


class WindowOrder:
    """Window start offsets of each batch, in an epoch's (shuffled) order.

    Offsets are computed a fixed-size chunk of batches at a time: large enough to amortise
    numpy's per-call overhead, small enough that memory stays independent of the token count.
    """

    def __init__(self, n_windows: int, batch_size: int, *, shuffle: bool, seed: int):
        self.n_windows, self.batch_size, self.shuffle, self.seed = n_windows, batch_size, shuffle, seed
        self.chunk = batch_size * max(1, _CHUNK_WINDOWS // batch_size)  # whole batches per chunk
        self._key: tuple[int, int] | None = None
        self._starts = np.empty(0, dtype=np.int64)

    def batch(self, epoch: int, index: int) -> np.ndarray:
        """Start offsets of batch ``index`` of ``epoch`` (the epoch's last batch may be short)."""
        chunk, offset = divmod(index * self.batch_size, self.chunk)
        if self._key != (epoch, chunk):
            positions = np.arange(chunk * self.chunk, min((chunk + 1) * self.chunk, self.n_windows))
            self._starts = (
                permuted_indices(positions, self.n_windows, epoch_keys(self.seed, epoch)) if self.shuffle else positions
            )
            self._key = (epoch, chunk)
        return self._starts[offset : offset + self.batch_size]


def window_view(tokens: np.ndarray, block: int) -> np.ndarray:
    """Every ``block + 1``-token window as a zero-copy ``(N, block + 1)`` strided view."""
    return sliding_window_view(tokens, block + 1)


def gather_windows(windows: np.ndarray, starts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(contexts (b, block), next_tokens (b,))`` as int64 from a :func:`window_view`."""
    batch = windows[starts].astype(np.int64, copy=False)  # copies only the b selected rows
    return batch[:, :-1], batch[:, -1]


def batches_per_epoch(n_tokens: int, block: int, batch_size: int, drop_last: bool) -> int:
    n_windows = max(n_tokens - block, 0)
    return n_windows // batch_size if drop_last else -(-n_windows // batch_size)


def stream_token_source(
    token_ids: ArrayLike,
    block: int,
    batch_size: int,
    *,
    epochs: int = 1,
    shuffle: bool = True,
    seed: int = 0,
    drop_last: bool = False,
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Yield ``(contexts, next_tokens)`` micro-batches over every window.

    Each epoch visits all ``len(token_ids) - block`` windows once, in an order keyed by
    ``(seed, epoch)`` when ``shuffle``. This is the reference (mixle's) schedule: one target per
    window; the streaming handle trains on :func:`stream_sequence_source`'s.

    Parameters
    ----------
    token_ids : array_like of int
        The token stream.
    block : int
        The context length.
    batch_size : int
        Windows per micro-batch.
    epochs : int, default 1
        Passes over the windows.
    shuffle : bool, default True
        Visit the windows in a random order (keyed by ``seed`` and the epoch).
    seed : int, default 0
        The seed of the order.
    drop_last : bool, default False
        Skip each epoch's short last batch, so every batch holds exactly ``batch_size`` windows.

    Yields
    ------
    contexts : numpy.ndarray
        ``(b, block)`` token ids.
    next_tokens : numpy.ndarray
        ``(b,)``: the token after each context.

    Raises
    ------
    ValueError
        A ``block``, ``batch_size`` or ``epochs`` that is not a positive int, or ``block`` not
        smaller than the token count.

    Examples
    --------
    >>> import numpy as np
    >>> from mixle_nb.neural import stream_token_source
    >>> batches = list(stream_token_source(np.arange(10), block=3, batch_size=4, shuffle=False))
    >>> len(batches)
    2
    >>> contexts, next_tokens = batches[0]
    >>> contexts.tolist(), next_tokens.tolist()
    ([[0, 1, 2], [1, 2, 3], [2, 3, 4], [3, 4, 5]], [3, 4, 5, 6])
    """
    tokens = as_token_array(token_ids)
    check_window_args(len(tokens), block, batch_size, epochs)
    order = WindowOrder(len(tokens) - block, batch_size, shuffle=shuffle, seed=seed)
    windows = window_view(tokens, block)
    for epoch in range(epochs):
        for index in range(batches_per_epoch(len(tokens), block, batch_size, drop_last)):
            yield gather_windows(windows, order.batch(epoch, index))


def sequence_windows(n_tokens: int, block: int) -> int:
    """Windows per epoch of the sequence schedule: ``block + 1`` tokens each, starting every
    ``block`` tokens from an offset below ``block``, so the count never depends on the offset."""
    return max(n_tokens // block - 1, 0)


def epoch_offset(seed: int, epoch: int, block: int, shuffle: bool) -> int:
    """Where an epoch's first sequence window starts: 0 unshuffled, else keyed by (seed, epoch),
    so the window boundaries (and so each token's context length) move from epoch to epoch."""
    if not shuffle:
        return 0
    return int(np.random.SeedSequence([seed, epoch, 1]).generate_state(1)[0] % block)


class SequenceOrder:
    """Start offsets of each batch of sequence windows, in an epoch's (shuffled) order."""

    def __init__(self, n_tokens: int, block: int, batch_size: int, *, shuffle: bool, seed: int):
        self.block, self.shuffle, self.seed = block, shuffle, seed
        self.n_windows = sequence_windows(n_tokens, block)
        self._order = WindowOrder(self.n_windows, batch_size, shuffle=shuffle, seed=seed)

    def batch(self, epoch: int, index: int) -> np.ndarray:
        """Token offsets of batch ``index`` of ``epoch`` (the epoch's last batch may be short)."""
        offset = epoch_offset(self.seed, epoch, self.block, self.shuffle)
        return offset + self.block * self._order.batch(epoch, index)


def gather_sequences(windows: np.ndarray, starts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(inputs (b, block), targets (b, block))`` as int64 from a :func:`window_view`."""
    batch = windows[starts].astype(np.int64, copy=False)  # copies only the b selected rows
    return batch[:, :-1], batch[:, 1:]


def stream_sequence_source(
    token_ids: ArrayLike,
    block: int,
    batch_size: int,
    *,
    epochs: int = 1,
    shuffle: bool = True,
    seed: int = 0,
    drop_last: bool = False,
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Yield ``(inputs, targets)`` micro-batches of the sequence schedule.

    Each epoch visits ``len(token_ids) // block - 1`` windows of ``block + 1`` tokens, starting
    every ``block`` tokens from an offset keyed by ``(seed, epoch)`` and in an order keyed likewise
    when ``shuffle``; ``targets[:, j]`` is the token after ``inputs[:, :j + 1]``, so every position
    is a target. This is the schedule :class:`~mixle_nb.parallel.StreamingTokenEncodedData` trains
    on.

    Parameters
    ----------
    token_ids : array_like of int
        The token stream.
    block : int
        The context length.
    batch_size : int
        Windows per micro-batch.
    epochs : int, default 1
        Passes over the windows.
    shuffle : bool, default True
        Draw each epoch's offset and window order (keyed by ``seed`` and the epoch); ``False``:
        offset 0, in order.
    seed : int, default 0
        The seed of the offsets and order.
    drop_last : bool, default False
        Skip each epoch's short last batch.

    Yields
    ------
    inputs : numpy.ndarray
        ``(b, block)`` token ids.
    targets : numpy.ndarray
        ``(b, block)``: each position's next token.

    Raises
    ------
    ValueError
        A ``block``, ``batch_size`` or ``epochs`` that is not a positive int, or too few tokens for
        one window (at least ``2 * block``).

    Examples
    --------
    >>> import numpy as np
    >>> from mixle_nb.neural import stream_sequence_source
    >>> [(inputs, targets)] = stream_sequence_source(np.arange(10), block=3, batch_size=2, shuffle=False)
    >>> inputs.tolist(), targets.tolist()
    ([[0, 1, 2], [3, 4, 5]], [[1, 2, 3], [4, 5, 6]])
    """
    tokens = as_token_array(token_ids)
    check_window_args(len(tokens), block, batch_size, epochs)
    order = SequenceOrder(len(tokens), block, batch_size, shuffle=shuffle, seed=seed)
    if order.n_windows == 0:
        raise ValueError(
            f"{len(tokens)} tokens hold no window of block + 1 = {block + 1} tokens at "
            f"every offset below block; give at least {2 * block} tokens"
        )
    windows = window_view(tokens, block)
    n_batches = order.n_windows // batch_size if drop_last else -(-order.n_windows // batch_size)
    for epoch in range(epochs):
        for index in range(n_batches):
            yield gather_sequences(windows, order.batch(epoch, index))


def check_window_args(n_tokens: int, block: int, batch_size: int, epochs: int) -> None:
    """Raise a clear error for window arguments that cannot produce a batch."""
    for name, value in (("block", block), ("batch_size", batch_size), ("epochs", epochs)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value <= 0:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    if block >= n_tokens:
        raise ValueError(
            f"block={block} must be smaller than the token count {n_tokens} "
            "(each window needs block + 1 tokens); use a smaller block or more tokens"
        )
