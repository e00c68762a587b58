"""``sample_weight`` checked as scikit-learn checks it, with its messages, before any work."""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike
from sklearn.utils import check_array


def checked_sample_weight(sample_weight: ArrayLike, n_samples: int) -> np.ndarray:
    """``sample_weight`` as a float64 array of one non-negative weight per row.

    Parameters
    ----------
    sample_weight : array-like of shape (n_samples,)
        The rows' weights: an integer weight ``w`` counts a row ``w`` times.
    n_samples : int
        The number of rows of ``X``.

    Returns
    -------
    numpy.ndarray
        The weights, float64, shape ``(n_samples,)``.

    Raises
    ------
    ValueError
        On a wrong shape, a NaN or infinite weight, a negative weight (naming its row) or
        weights that are all zero (scikit-learn's messages).
    """
    weights = check_array(sample_weight, ensure_2d=False, dtype=np.float64, input_name="sample_weight")
    if weights.shape != (n_samples,):
        raise ValueError(f"sample_weight.shape == {weights.shape}, expected {(n_samples,)}!")
    negative = np.flatnonzero(weights < 0)
    if len(negative):
        raise ValueError(
            f"Negative values in data passed to `sample_weight` (row {int(negative[0])}: {float(weights[negative[0]])!r})"
        )
    if not np.any(weights > 0):
        raise ValueError("Sample weights must contain at least one non-zero number.")
    return weights
