"""``weights_init``, ``means_init`` and ``precisions_init`` checked as scikit-learn checks them,
with its messages, through its public ``check_array`` and numpy alone (scikit-learn's own
checks are private functions of its mixture module)."""

from __future__ import annotations

import numpy as np
from sklearn.utils import check_array

# The shape of ``precisions_init`` for each covariance type, given K components and D features
PRECISION_SHAPES = {
    "full": lambda k, d: (k, d, d),
    "tied": lambda k, d: (d, d),
    "diag": lambda k, d: (k, d),
    "spherical": lambda k, d: (k,),
}


def checked_weights(weights: object, n_components: int) -> np.ndarray:
    """``weights_init`` as an array, checked.

    Parameters
    ----------
    weights : array-like of shape (n_components,)
        The mixture weights.
    n_components : int
        The number of components.

    Returns
    -------
    numpy.ndarray
        The weights, float64 or float32 as given.

    Raises
    ------
    ValueError
        If the shape is wrong, a weight lies outside [0, 1], or they do not sum to 1
        (scikit-learn's messages).
    """
    weights = _checked(weights, (n_components,), "weights")
    if np.any(weights < 0.0) or np.any(weights > 1.0):
        # scikit-learn's message, word for word: it prints the minimum as "max value" and the
        # maximum as "min value"
        raise ValueError(
            "The parameter 'weights' should be in the range [0, 1], but got max value "
            f"{np.min(weights):.5f}, min value {np.max(weights):.5f}"
        )
    atol = 1e-6 if weights.dtype == np.float32 else 1e-8
    if not np.allclose(float(np.abs(1.0 - np.sum(weights))), 0.0, atol=atol):
        raise ValueError(f"The parameter 'weights' should be normalized, but got sum(weights) = {np.sum(weights):.5f}")
    return weights


def checked_means(means: object, n_components: int, n_features: int) -> np.ndarray:
    """``means_init`` as an array, checked.

    Parameters
    ----------
    means : array-like of shape (n_components, n_features)
        The component means.
    n_components, n_features : int
        The expected shape.

    Returns
    -------
    numpy.ndarray
        The means.

    Raises
    ------
    ValueError
        If the shape is wrong (scikit-learn's message).
    """
    return _checked(means, (n_components, n_features), "means")


def checked_precisions(precisions: object, covariance_type: str, n_components: int, n_features: int) -> np.ndarray:
    """``precisions_init`` as an array, checked.

    Parameters
    ----------
    precisions : array-like
        ``(K, D, D)`` for ``"full"``, ``(D, D)`` for ``"tied"``, ``(K, D)`` for ``"diag"``,
        ``(K,)`` for ``"spherical"``.
    covariance_type : {"full", "tied", "diag", "spherical"}
        The covariance type.
    n_components, n_features : int
        K and D.

    Returns
    -------
    numpy.ndarray
        The precisions.

    Raises
    ------
    ValueError
        If the shape is wrong, a precision is not positive, or a precision matrix is not
        symmetric positive-definite (scikit-learn's messages).
    """
    shape = PRECISION_SHAPES[covariance_type](n_components, n_features)
    precisions = _checked(precisions, shape, f"{covariance_type} precision", allow_nd=covariance_type == "full")
    if covariance_type in ("diag", "spherical"):
        if np.any(precisions <= 0.0):
            raise ValueError(f"'{covariance_type} precision' should be positive")
        return precisions
    for matrix in precisions if covariance_type == "full" else [precisions]:
        if not (np.all(np.isclose(matrix, matrix.T)) and np.all(np.linalg.eigvalsh(matrix) > 0.0)):
            raise ValueError(f"'{covariance_type} precision' should be symmetric, positive-definite")
    return precisions


def _checked(values: object, shape: tuple[int, ...], name: str, allow_nd: bool = False) -> np.ndarray:
    """``values`` through scikit-learn's public ``check_array``, of ``shape``."""
    array = check_array(values, dtype=[np.float64, np.float32], ensure_2d=False, allow_nd=allow_nd)
    if array.shape != shape:
        raise ValueError(f"The parameter '{name}' should have the shape of {shape}, but got {array.shape}")
    return array
