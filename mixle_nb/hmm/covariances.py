"""hmmlearn's covariance shapes: checks, the full matrices of each type, the start's layout."""

from __future__ import annotations

import numpy as np

COVARIANCE_TYPES = frozenset(("spherical", "diag", "full", "tied"))


def validate_covars(covars: np.ndarray, covariance_type: str, n_components: int) -> None:
    """hmmlearn's ``_validate_covars``, with its messages."""
    if covariance_type == "spherical":
        if len(covars) != n_components:
            raise ValueError("'spherical' covars have length n_components")
        if np.any(covars <= 0):
            raise ValueError("'spherical' covars must be positive")
    elif covariance_type == "tied":
        if covars.shape[0] != covars.shape[1]:
            raise ValueError("'tied' covars must have shape (n_dim, n_dim)")
        if not np.allclose(covars, covars.T) or np.any(np.linalg.eigvalsh(covars) <= 0):
            raise ValueError("'tied' covars must be symmetric, positive-definite")
    elif covariance_type == "diag":
        if len(covars.shape) != 2:
            raise ValueError("'diag' covars must have shape (n_components, n_dim)")
        if np.any(covars <= 0):
            raise ValueError("'diag' covars must be positive")
    elif covariance_type == "full":
        if len(covars.shape) != 3:
            raise ValueError("'full' covars must have shape (n_components, n_dim, n_dim)")
        if covars.shape[1] != covars.shape[2]:
            raise ValueError("'full' covars must have shape (n_components, n_dim, n_dim)")
        for n, cv in enumerate(covars):
            if not np.allclose(cv, cv.T) or np.any(np.linalg.eigvalsh(cv) <= 0):
                raise ValueError(f"component {n} of 'full' covars must be symmetric, positive-definite")
    else:
        raise ValueError("covariance_type must be one of " + "'spherical', 'tied', 'diag', 'full'")


def fill_covars(
    covars: np.ndarray, covariance_type: str = "full", n_components: int = 1, n_features: int = 1
) -> np.ndarray:
    """Full (n_components, n_features, n_features) matrices from a type's compact covariances."""
    if covariance_type == "full":
        return covars
    if covariance_type == "diag":
        return np.array(list(map(np.diag, covars)))
    if covariance_type == "tied":
        return np.tile(covars, (n_components, 1, 1))
    covars = np.ravel(covars)
    return np.eye(n_features)[np.newaxis, :, :] * covars[:, np.newaxis, np.newaxis]


def distribute_covar_matrix(tied_cv: np.ndarray, covariance_type: str, n_components: int) -> np.ndarray:
    """The start's covariances of each type from one (n_features, n_features) matrix."""
    if covariance_type == "spherical":
        return np.tile(tied_cv.mean() * np.ones(tied_cv.shape[1]), (n_components, 1))[:, 0]
    if covariance_type == "tied":
        return tied_cv
    if covariance_type == "diag":
        return np.tile(np.diag(tied_cv), (n_components, 1))
    if covariance_type == "full":
        return np.tile(tied_cv, (n_components, 1, 1))
    raise ValueError("covariance_type must be one of 'spherical', 'tied', 'diag', 'full'")
