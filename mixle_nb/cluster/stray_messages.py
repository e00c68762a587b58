"""Stray messages on the client's sockets: dropped, counted, and never a stalled stream.

ipyparallel's client parses each message in the callback of the stream it arrived on. A message
without the ``<IDS|MSG>`` delimiter (one that another process slipped through the controller,
e.g. random bytes sent to its iopub port) raises out of that callback, and the stream then stops
reading the messages already queued behind it: a call's reply can sit unread until the next
message happens to arrive, so the call hangs. A message with a wrong signature is logged with a
traceback for each one. :class:`MessageGuard` checks every message's framing and signature before
ipyparallel sees it, drops and counts those that fail, and keeps each stream reading whatever
happens in ipyparallel's handler.
"""

from __future__ import annotations

import hmac
import logging
import threading
from collections import Counter
from collections.abc import Callable
from typing import Any

from .ipyparallel_internals import expected_signature, receiving_streams, replace_handler

_DELIMITER = b"<IDS|MSG>"
_log = logging.getLogger(__name__)


def malformed(session: Any, frames: list[Any]) -> str | None:
    """Why ``frames`` (zmq frames as received) cannot be a message of ``session``'s peers, or
    None when it can: its delimiter, its frame count and its HMAC signature are checked."""
    parts = [frame.bytes for frame in frames]
    if _DELIMITER not in parts:
        return "no delimiter"
    body = parts[parts.index(_DELIMITER) + 1 :]
    if len(body) < 5:
        return "too few frames"
    signature = expected_signature(session, body[1:5])
    if signature is not None and not hmac.compare_digest(body[0], signature):
        return "bad signature"
    return None


class MessageGuard:
    """Screens every message a connected ``ipyparallel.Client`` receives.

    Attributes
    ----------
    dropped : collections.Counter
        Messages dropped so far, by ``"<stream>: <reason>"`` (e.g. ``"iopub: no delimiter"``).
    """

    def __init__(self, client: Any) -> None:
        self.dropped: Counter[str] = Counter()
        self._lock = threading.Lock()  # counted on the client's IO thread, read on any
        for name, (stream, handle) in receiving_streams(client).items():
            replace_handler(stream, self._screened(name, client.session, handle))

    def counts(self) -> dict[str, int]:
        """A snapshot of :attr:`dropped`."""
        with self._lock:
            return dict(self.dropped)

    def _drop(self, key: str) -> None:
        with self._lock:
            first = key not in self.dropped
            self.dropped[key] += 1
        if first:
            _log.warning("dropped a stray message on the cluster client's socket (%s)", key)

    def _screened(self, name: str, session: Any, handle: Callable[[list[Any]], Any]) -> Callable[[list[Any]], None]:
        """``handle`` for the messages that pass :func:`malformed`; it never raises."""

        def screened(frames: list[Any]) -> None:
            reason = malformed(session, frames)
            if reason is not None:
                self._drop(f"{name}: {reason}")
                return
            try:
                handle(frames)
            except Exception:  # a raising handler would stall the stream behind it
                _log.exception("ipyparallel's handler of a %s message failed", name)
                self._drop(f"{name}: handler failed")

        return screened
