"""``CategoricalHMM``: hmmlearn's HMM over integer symbols ``0 .. n_features - 1``.

The states emit from :class:`~mixle_nb.stats.CategoricalDistribution` (its per-label
log-densities and weighted counts); the M-step is hmmlearn's (``emissionprob_prior``)."""

from __future__ import annotations

from typing import Any

import numpy as np
from sklearn.utils import check_random_state

from ..stats.categorical import CategoricalDistribution, CategoricalEstimator
from ..stats.hmm import HiddenMarkovDistribution
from ..stats.hmm.encoding import symbol_report
from ..stats.hmm.model import normalized_rows
from .base import BaseHMM


class CategoricalUpdate:
    """hmmlearn's M-step for the emission probabilities (picklable: it crosses to the ranks)."""

    def __init__(self, face: CategoricalHMM):
        self.params, self.prior = face.params, face.emissionprob_prior
        self.emissionprob, self.n_features = face.emissionprob_, face.n_features

    def __call__(self, occupancy: np.ndarray, values: list, previous: HiddenMarkovDistribution) -> list:
        probs = self.emissionprob
        if "e" in self.params:
            counts = np.zeros((len(values), self.n_features))
            for k, value in enumerate(values):
                for symbol, count in value.items():
                    counts[k, int(symbol)] += count
            probs = normalized_rows(np.maximum(self.prior - 1 + counts, 0))
        return symbol_distributions(probs)


def symbol_distributions(probs: np.ndarray) -> list:
    return [CategoricalDistribution(dict(enumerate(row.tolist()))) for row in probs]


class CategoricalHMM(BaseHMM):
    """Hidden Markov model with categorical emissions, as :class:`hmmlearn.hmm.CategoricalHMM`.

    ``X`` has shape (n_samples, 1): one integer symbol per sample.

    Parameters
    ----------
    n_components : int
        Number of states.
    startprob_prior, transmat_prior : array-like or float
        Dirichlet priors of ``startprob_`` and of each row of ``transmat_``.
    emissionprob_prior : array-like or float
        Dirichlet prior of each row of ``emissionprob_``.
    n_features : int, optional
        Number of symbols; inferred from the data if not set.
    algorithm, random_state, n_iter, tol, verbose, implementation
        As :class:`~mixle_nb.hmm.GaussianHMM`.
    params, init_params : str
        ``s`` startprob, ``t`` transmat, ``e`` emissionprob.

    Attributes
    ----------
    n_features : int
    monitor_ : ConvergenceMonitor
    startprob_ : ndarray, shape (n_components,)
    transmat_ : ndarray, shape (n_components, n_components)
    emissionprob_ : ndarray, shape (n_components, n_features)

    Examples
    --------
    >>> import numpy as np
    >>> from mixle_nb.hmm import CategoricalHMM
    >>> X = np.random.default_rng(0).integers(0, 3, size=(50, 1))
    >>> CategoricalHMM(2, random_state=0).fit(X).emissionprob_.shape
    (2, 3)
    """

    _dtype = None

    def __init__(
        self,
        n_components: int = 1,
        startprob_prior: float | np.ndarray = 1.0,
        transmat_prior: float | np.ndarray = 1.0,
        *,
        emissionprob_prior: float | np.ndarray = 1.0,
        n_features: int | None = None,
        algorithm: str = "viterbi",
        random_state: Any = None,
        n_iter: int = 10,
        tol: float = 1e-2,
        verbose: bool = False,
        params: str = "ste",
        init_params: str = "ste",
        implementation: str = "log",
    ) -> None:
        super().__init__(
            n_components,
            startprob_prior=startprob_prior,
            transmat_prior=transmat_prior,
            algorithm=algorithm,
            random_state=random_state,
            n_iter=n_iter,
            tol=tol,
            verbose=verbose,
            params=params,
            init_params=init_params,
            implementation=implementation,
        )
        self.emissionprob_prior = emissionprob_prior
        self.n_features = n_features

    def _check_and_set_n_features(self, X: np.ndarray) -> None:
        if not np.issubdtype(X.dtype, np.integer):
            raise ValueError("Symbols should be integers")
        if X.min() < 0:
            raise ValueError("Symbols should be nonnegative")
        if self.n_features is not None:
            if self.n_features - 1 < X.max():
                raise ValueError(
                    f"Largest symbol is {X.max()} but the model only emits symbols up to {self.n_features - 1}"
                )
        else:
            self.n_features = int(X.max()) + 1

    def _prepare(self, X: np.ndarray) -> np.ndarray:
        if X.shape[1] != 1:
            raise ValueError(f"CategoricalHMM expects X of shape (n_samples, 1); got {X.shape}")
        return X[:, 0]

    def _check_handle(self, handle: Any) -> None:
        """hmmlearn's checks of the symbols, over every rank's sequences at once (one gather of
        three numbers a sequence): every rank raises the same error, naming the first bad
        symbol's global sequence, position and rank."""
        if not hasattr(handle, "pysp_shard_map"):  # mixle's handle: its encoder checks what it can
            return
        rank, n_symbols = getattr(handle, "rank", 0), int(self.n_features)
        report = handle.pysp_shard_map(
            lambda enc: np.column_stack([symbol_report(enc, n_symbols), np.full(len(enc), rank)]), gather=True
        )
        bad = np.flatnonzero(report[:, 0] >= 0)
        if not bad.size:
            return
        position, symbol, _, held_by = report[bad[0]]
        where = f"sequence {bad[0]}, position {int(position)} holds {symbol:g} (on rank {int(held_by)})"
        if symbol != np.round(symbol) or symbol < 0:
            kind = "integers" if symbol != np.round(symbol) else "nonnegative"
            raise ValueError(f"Symbols should be {kind}: {where}; encode the symbols as 0 .. n_features - 1")
        largest = int(report[:, 2].max())
        raise ValueError(
            f"Largest symbol is {largest} but the model only emits symbols up to {n_symbols - 1}: {where}; "
            f"pass n_features={largest + 1} (with emissionprob_ of that width) or drop those symbols"
        )

    def _get_n_fit_scalars_per_param(self) -> dict:
        nc, nf = self.n_components, self.n_features
        return {"s": nc - 1, "t": nc * (nc - 1), "e": nc * (nf - 1)}

    def _init_emissions(self, X: np.ndarray | None, lengths: np.ndarray | None) -> None:
        self.random_state = check_random_state(self.random_state)
        if self._needs_init("e", "emissionprob_"):
            if self.n_features is None:
                raise ValueError("fit on a handle needs n_features= or emissionprob_ set")
            self.emissionprob_ = normalized_rows(self.random_state.rand(self.n_components, self.n_features))

    def _check_emissions(self) -> None:
        self.emissionprob_ = np.atleast_2d(self.emissionprob_)
        if self.n_features is None:
            self.n_features = self.emissionprob_.shape[1]
        if self.emissionprob_.shape != (self.n_components, self.n_features):
            raise ValueError(f"emissionprob_ must have shape({self.n_components}, {self.n_features})")
        self._check_sum_1("emissionprob_")

    def _emissions(self) -> list:
        return symbol_distributions(self.emissionprob_)

    def _emission_estimators(self) -> list:
        return [CategoricalEstimator() for _ in range(self.n_components)]

    def _emission_update(self) -> CategoricalUpdate:
        return CategoricalUpdate(self)

    def _set_emissions(self, model: HiddenMarkovDistribution) -> None:
        probs = np.zeros((self.n_components, self.n_features))
        for k, e in enumerate(model.emissions):
            for symbol, p in e.pmap.items():
                probs[k, int(symbol)] = p
        self.emissionprob_ = probs

    def _generate_sample_from_state(self, state: int, random_state: np.random.RandomState) -> list:
        cdf = np.cumsum(self.emissionprob_[state, :])
        return [(cdf > random_state.rand()).argmax()]
