"""Fail together: when one rank's part of an SPMD operation raises, every rank raises at once.

A rank that fails does not leave its peers waiting in the next collective. It still takes part
in the exchange the operation already makes, carrying a status word instead of (or beside) its
result; when any status says "failed", every rank joins one more exchange — only on that
failure path — that shares each failed rank's message
(:meth:`~mixle_nb.parallel.exchange.RankExchange.settle`, the one failure path of both handles). The failed rank then re-raises its own
error; every other rank raises :class:`PeerRankError`, naming the failed rank(s) and their
messages, so a cluster can tell the root cause (the original error) from its consequences.

Where the peers may wait inside collectives the failed rank cannot stand in for (FSDP2's own
all-gathers and reduce-scatters), :func:`fail_by_severing` is the failure path instead: the
message goes to the group's store and the failed rank's connections are shut down.
"""

from __future__ import annotations

import hashlib
import pickle
import re
import time
import zlib
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any, NoReturn

import numpy as np

from .severing import sever_group
from .torch_internals import default_store

ANNOUNCE_WAIT_S = 2.0  # how long a rank whose collective broke looks for a peer's message
_BROKEN = re.compile(r"Connection closed by peer|Connection reset by peer|Broken pipe|Timed out waiting", re.IGNORECASE)


class PeerRankError(RuntimeError):
    """Another rank failed in the SPMD operation this rank was taking part in.

    The handles raise it on every rank but the failed ones, which raise their own error, so all
    ranks fail together instead of waiting in a collective. ``rank`` and ``message`` are the
    lowest failed rank's. ``str()`` reads ``rank 1: <its message>`` (one clause per failed rank),
    prefixed by the operation when one was named.

    Parameters
    ----------
    failures : mapping of int to str
        Each failed group rank and its error message (at least one).
    operation : str, optional
        What failed, e.g. ``"EM step"``.

    Raises
    ------
    ValueError
        ``failures`` is empty.

    See Also
    --------
    mixle_nb.cluster.RankError : How the client reports it (named by the root cause).

    Examples
    --------
    >>> from mixle_nb.parallel import PeerRankError
    >>> error = PeerRankError({2: "x has NaN", 1: "shape mismatch"}, "EM step")
    >>> print(error)
    EM step failed on another rank: rank 1: shape mismatch; rank 2: x has NaN
    >>> error.rank
    1
    """

    def __init__(self, failures: Mapping[int, str], operation: str = ""):
        if not failures:
            raise ValueError("PeerRankError needs at least one failed rank")
        self.failures = dict(sorted(failures.items()))
        self.operation = operation
        self.rank, self.message = next(iter(self.failures.items()))
        text = "; ".join(f"rank {rank}: {message}" for rank, message in self.failures.items())
        super().__init__(f"{operation} failed on another rank: {text}" if operation else text)

    def __reduce__(self) -> tuple[type[PeerRankError], tuple[dict[int, str], str]]:  # keep the fields through pickling
        return type(self), (self.failures, self.operation)


def failure_message(error: BaseException) -> str:
    """What a peer is told: the error's own text, or its type when the text is empty."""
    if isinstance(error, PeerRankError):  # pass the root cause on, not "another rank failed"
        return "; ".join(f"rank {r}: {m}" for r, m in error.failures.items())
    return str(error) or type(error).__name__


def raise_failures(
    failures: Mapping[int, str], rank: int, local_error: BaseException | None = None, operation: str = ""
) -> NoReturn:
    """Raise, on ``rank``, the outcome every rank agreed on: its own error if it had one, a
    ``ValueError`` with its entry in ``failures`` if the ranks found it at fault (its input
    differs from the others'), else :class:`PeerRankError`. Never returns."""
    if local_error is not None:
        raise local_error
    if rank in failures:
        raise ValueError(failures[rank])
    raise PeerRankError(failures, operation)


def fail_by_severing(error: BaseException, rank: int, world: int, operation: str = "") -> NoReturn:
    """The failure path when peers may be blocked in collectives this rank cannot join.

    If ``error`` is this rank's collective breaking because a peer failed first, raise
    :class:`PeerRankError` with the message that peer left in the store. Otherwise this rank
    failed: leave the message in the default group's store, shut down its connections (every
    peer's pending collective fails at once) and re-raise ``error``. The group is unusable
    afterwards; a MixleCluster forms it again. Without known connections (a group created by
    ``init_process_group`` outside :mod:`mixle_nb.parallel.group`) the peers learn only at the
    group timeout, and then name this rank all the same."""
    if world == 1:
        raise error
    store = default_store()  # the rendezvous store every rank shares
    broken = bool(_BROKEN.search(str(error)))
    failures = _announced_failures(store, rank, world, ANNOUNCE_WAIT_S if broken else 0.0)
    if failures:
        raise PeerRankError(failures, operation) from error
    store.set(_announce_key(rank), failure_message(error))
    sever_group()
    raise error


def _announce_key(rank: int) -> str:
    return f"mixle_nb/failed/{rank}"


def _announced_failures(store: Any, rank: int, world: int, wait_s: float) -> dict:
    """``{rank: message}`` the other ranks left in the store, polled for up to ``wait_s``."""
    deadline = time.monotonic() + wait_s
    while True:
        found = {
            r: store.get(_announce_key(r)).decode()
            for r in range(world)
            if r != rank and store.check([_announce_key(r)])
        }
        if found or time.monotonic() >= deadline:
            return found
        time.sleep(0.01)


# -- agreement: do all ranks hold the same thing? Checked inside a summed vector the step already
# exchanges: each rank adds (1, h, h²) for a hash h of its text; all hashes are equal exactly when
# n·Σh² = (Σh)² (Cauchy–Schwarz), which every rank computes from the same sums.


def hash_bits(world: int) -> int:
    """Bits of hash that keep n·Σh² and (Σh)² exact in float64 for ``world`` ranks."""
    return max(8, min(20, (52 - 2 * max(1, world - 1).bit_length()) // 2))


def agreement_slots(text: str | None, world: int) -> list:
    """``[1, h, h²]`` for ``text`` (``[0, 0, 0]``: this rank has nothing to compare)."""
    if text is None:
        return [0.0, 0.0, 0.0]
    h = float(zlib.crc32(text.encode()) % (1 << hash_bits(world)))
    return [1.0, h, h * h]


def agreed(slots: Sequence[float] | np.ndarray) -> bool:
    """Whether every rank that sent a text sent the same one, from the summed slots."""
    n, s, s2 = (float(v) for v in slots)
    return n * s2 == s * s


def fingerprint(obj: Any) -> str:
    """A text equal on two ranks exactly when ``obj`` is the same model or estimator there: its
    ``repr`` when that shows its contents (a model's parameters, at full precision), else a
    digest of its pickle (a plain object's repr shows only its address)."""
    text = repr(obj)
    if " object at 0x" not in text:
        return text
    return f"{type(obj).__qualname__} (pickle sha1 {hashlib.sha1(pickle.dumps(obj)).hexdigest()})"


def odd_ones_out(texts: Mapping[int, str | None], what: str, fix: str) -> dict:
    """``{rank: message}`` for each rank whose text differs from the most common one (ties go to
    the lowest rank's); ranks with no text are left out. ``{rank}`` in ``fix`` becomes the rank
    at fault."""
    present = {rank: text for rank, text in texts.items() if text is not None}
    if not present:
        return {}
    counts = Counter(present.values())
    reference_rank = min(present, key=lambda r: (-counts[present[r]], r))
    reference = present[reference_rank]
    return {
        rank: f"{what} differs from rank {reference_rank}'s ({_short(text)} vs {_short(reference)}): "
        + fix.replace("{rank}", str(rank))
        for rank, text in present.items()
        if text != reference
    }


def _short(text: str, limit: int = 160) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."
