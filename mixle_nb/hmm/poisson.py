"""``PoissonHMM``: hmmlearn's HMM over counts, a Poisson per feature and state.

The states emit from independent columns of :class:`~mixle_nb.stats.PoissonDistribution`
(:class:`~mixle_nb.stats.hmm.columns.ColumnsDistribution`); the M-step is hmmlearn's
(``lambdas_prior``, ``lambdas_weight``)."""

from __future__ import annotations

from typing import Any

import numpy as np
from sklearn.utils import check_random_state

from ..stats.hmm import HiddenMarkovDistribution
from ..stats.hmm.columns import ColumnsDistribution, ColumnsEstimator
from ..stats.poisson import PoissonDistribution, PoissonEstimator
from .base import BaseHMM


class PoissonUpdate:
    """hmmlearn's M-step for the rates (picklable: it crosses to the ranks)."""

    def __init__(self, face: PoissonHMM):
        self.params, self.lambdas = face.params, face.lambdas_
        self.alphas, self.betas = face.lambdas_prior, face.lambdas_weight

    def __call__(self, occupancy: np.ndarray, values: list, previous: HiddenMarkovDistribution) -> list:
        lambdas = self.lambdas
        if "l" in self.params:
            post = np.array([value[0][0] for value in values])
            obs = np.array([[column[1] for column in value] for value in values])
            n = post.sum()
            y_bar = obs / post[:, None]
            lambdas = (self.alphas + n * y_bar) / (self.betas + n)
        return rate_distributions(lambdas)


def rate_distributions(lambdas: np.ndarray) -> list:
    return [ColumnsDistribution([PoissonDistribution(lam) for lam in row]) for row in np.atleast_2d(lambdas)]


class PoissonHMM(BaseHMM):
    """Hidden Markov model with Poisson emissions, as :class:`hmmlearn.hmm.PoissonHMM`.

    Parameters
    ----------
    n_components : int
        Number of states.
    startprob_prior, transmat_prior : array-like or float
        Dirichlet priors of ``startprob_`` and of each row of ``transmat_``.
    lambdas_prior, lambdas_weight : array-like or float
        Gamma prior on ``lambdas_``.
    algorithm, random_state, n_iter, tol, verbose, implementation
        As :class:`~mixle_nb.hmm.GaussianHMM`.
    params, init_params : str
        ``s`` startprob, ``t`` transmat, ``l`` lambdas.

    Attributes
    ----------
    n_features : int
    monitor_ : ConvergenceMonitor
    startprob_ : ndarray, shape (n_components,)
    transmat_ : ndarray, shape (n_components, n_components)
    lambdas_ : ndarray, shape (n_components, n_features)

    Examples
    --------
    >>> import numpy as np
    >>> from mixle_nb.hmm import PoissonHMM
    >>> X = np.random.default_rng(0).poisson(3, size=(60, 2))
    >>> PoissonHMM(2, random_state=0).fit(X).lambdas_.shape
    (2, 2)
    """

    def __init__(
        self,
        n_components: int = 1,
        startprob_prior: float | np.ndarray = 1.0,
        transmat_prior: float | np.ndarray = 1.0,
        lambdas_prior: float | np.ndarray = 0.0,
        lambdas_weight: float | np.ndarray = 0.0,
        algorithm: str = "viterbi",
        random_state: Any = None,
        n_iter: int = 10,
        tol: float = 1e-2,
        verbose: bool = False,
        params: str = "stl",
        init_params: str = "stl",
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
        self.lambdas_prior = lambdas_prior
        self.lambdas_weight = lambdas_weight

    def _get_n_fit_scalars_per_param(self) -> dict:
        nc, nf = self.n_components, self.n_features
        return {"s": nc - 1, "t": nc * (nc - 1), "l": nc * nf}

    def _init_emissions(self, X: np.ndarray | None, lengths: np.ndarray | None) -> None:
        self.random_state = check_random_state(self.random_state)
        if self._needs_init("l", "lambdas_"):
            if X is None:
                raise ValueError(
                    "fit on a handle starts from set rates: set lambdas_ (and leave 'l' out of init_params)"
                )
            mean_x, var_x = X.mean(), X.var()
            self.lambdas_ = self.random_state.gamma(
                shape=mean_x**2 / var_x, scale=var_x / mean_x, size=(self.n_components, self.n_features)
            )

    def _check_emissions(self) -> None:
        self.lambdas_ = np.atleast_2d(self.lambdas_)
        n_features = getattr(self, "n_features", self.lambdas_.shape[1])
        if self.lambdas_.shape != (self.n_components, n_features):
            raise ValueError("lambdas_ must have shape (n_components, n_features)")
        self.n_features = n_features

    def _emissions(self) -> list:
        return rate_distributions(self.lambdas_)

    def _emission_estimators(self) -> list:
        return [
            ColumnsEstimator([PoissonEstimator(min_lam=0.0) for _ in range(self.n_features)])
            for _ in range(self.n_components)
        ]

    def _emission_update(self) -> PoissonUpdate:
        return PoissonUpdate(self)

    def _set_emissions(self, model: HiddenMarkovDistribution) -> None:
        self.lambdas_ = np.array([[c.lam for c in e.components] for e in model.emissions])

    def _generate_sample_from_state(self, state: int, random_state: np.random.RandomState) -> np.ndarray:
        return random_state.poisson(self.lambdas_[state])
