"""Rows that carry their sample weight in their last column, for a handle on ranks: the weights
travel with the rows (in memory, scattered, or read by each rank from a ``.npy`` or files) and
never pass through the notebook."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from numpy.typing import ArrayLike

from ..stats.frame import PointEncoding, with_weights


class WeightedRowsEncoder:
    """Encodes ``(N, D + 1)`` rows as ``inner`` encodes their first ``D`` columns, the last
    column as the rows' sample weights (checked: finite and non-negative, naming the row).

    Parameters
    ----------
    inner : Encoder
        One of our Gaussian encoders (``estimator.accumulator_factory().make().acc_to_encoder()``).
    """

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def seq_encode(self, data: ArrayLike, device: torch.device | str | None = None) -> PointEncoding:
        """The encoding of the points, their weights attached.

        Raises
        ------
        ValueError
            If a weight is NaN, infinite or negative (naming its row within ``data``).
        """
        rows = np.asarray(data, dtype=np.float64)
        if rows.ndim != 2 or rows.shape[1] < 2:
            raise ValueError(f"weighted rows are (n_samples, n_features + 1), the weight last; got shape {rows.shape}")
        weights = rows[:, -1]
        bad = np.flatnonzero(~(np.isfinite(weights) & (weights >= 0)))
        if len(bad):
            raise ValueError(
                f"sample weight of row {int(bad[0])}{self._whose()} is {float(weights[bad[0]])!r}: weights must be finite and "
                "non-negative (Negative values in data passed to `sample_weight` / Input sample_weight "
                "contains NaN or infinity)"
            )
        return with_weights(self.inner.seq_encode(rows[:, :-1], device=device), weights)

    @staticmethod
    def _whose() -> str:
        """`` of rank R's rows`` under torch.distributed (rows counted within that rank's part)."""
        import torch.distributed as dist

        return f" of rank {dist.get_rank()}'s rows" if dist.is_available() and dist.is_initialized() else ""
