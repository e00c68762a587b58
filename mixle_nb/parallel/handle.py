"""The encoded-data handle protocol shared by every distributed backend."""
from __future__ import annotations

from typing import Any


class EncodedDataHandle:
    """Resident encoded data that the ``seq_*`` dispatch recognises by its ``pysp_*`` methods.

    A handle owns a shard of encoded data (on a rank, a worker, a device) and answers the
    four estimation requests against it. Dispatch never checks ``isinstance``: any object
    with the matching ``pysp_*`` method is a handle. Subclasses override what they support.
    """

    def pysp_seq_estimate(self, estimator: Any, prev_estimate: Any) -> Any:
        """One estimation step against the resident data; returns the new model."""
        raise NotImplementedError(f"{type(self).__name__} does not implement pysp_seq_estimate")

    def pysp_seq_initialize(self, estimator: Any, rng: Any, p: float) -> Any:
        """Randomised initial model from the resident data."""
        raise NotImplementedError(f"{type(self).__name__} does not implement pysp_seq_initialize")

    def pysp_seq_log_density_sum(self, model: Any) -> tuple[float, float]:
        """``(count, total log-density)`` of the resident data under ``model``."""
        raise NotImplementedError(
            f"{type(self).__name__} does not implement pysp_seq_log_density_sum"
        )

    def pysp_stream_accumulate(self, estimator: Any, model: Any) -> tuple[float, Any]:
        """``(count, folded accumulator)`` for streaming EM, without an M-step."""
        raise NotImplementedError(f"{type(self).__name__} does not implement pysp_stream_accumulate")

    def close(self) -> None:
        """Release worker resources owned by this handle, if any."""

    def __enter__(self):
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()
