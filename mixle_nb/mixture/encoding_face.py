"""What both mixtures' scikit-learn faces give for building a handle on the ranks: the Gaussian
mixture estimator whose encoding their fits read, and the encoder of rows carrying a weight."""

from __future__ import annotations

from ..stats import MixtureEstimator
from .translation import mixture_estimator
from .weighted_rows import WeightedRowsEncoder


class HandleEncoding:
    """The handle-building methods of ``GaussianMixture`` and ``BayesianGaussianMixture``
    (from their ``covariance_type``, ``n_components`` and ``reg_covar``)."""

    covariance_type: str
    n_components: int
    reg_covar: float

    def mixture_estimator(self, n_features: int) -> MixtureEstimator:
        """The Gaussian mixture estimator whose encoding the fit reads (to build a handle with).

        Parameters
        ----------
        n_features : int
            The observations' dimension.

        Returns
        -------
        MixtureEstimator
            The estimator of ``n_components`` Gaussians of ``covariance_type``, whose E-step runs
            in the face's ``dtype`` where it has one (``GaussianMixture(dtype="float32")``), else
            in float64.

        Examples
        --------
        >>> from mixle_nb.mixture import GaussianMixture
        >>> len(GaussianMixture(n_components=3).mixture_estimator(2).estimators)
        3
        """
        dtype = getattr(self, "dtype", None)  # GaussianMixture's E-step dtype; float64 where unset
        return mixture_estimator(self.covariance_type, self.n_components, n_features, self.reg_covar, dtype)

    def weighted_rows_encoder(self, n_features: int) -> WeightedRowsEncoder:
        """The encoder of rows that carry their sample weight as a last column (for a handle).

        Build a handle with it (``TorchRunEncodedData(rows, encoder=...)``, ``from_npy``,
        ``from_files``) and ``fit`` weighs every row by its weight on the rank that holds it.

        Parameters
        ----------
        n_features : int
            ``D``: the rows are ``(n_samples, D + 1)``, the weight last.

        Returns
        -------
        WeightedRowsEncoder
            The encoder.

        Examples
        --------
        >>> import numpy as np
        >>> from mixle_nb.mixture import GaussianMixture
        >>> rows = np.array([[0.0, 2.0], [1.0, 1.0]])
        >>> GaussianMixture(n_components=2).weighted_rows_encoder(1).seq_encode(rows).weights.tolist()
        [2.0, 1.0]
        """
        return WeightedRowsEncoder(self.mixture_estimator(n_features).accumulator_factory().make().acc_to_encoder())
