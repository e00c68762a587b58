"""hmmlearn's ``ConvergenceMonitor``: the log-likelihood of each EM iteration and the stopping rule."""

from __future__ import annotations

import logging
import sys
from collections import deque

import numpy as np

_log = logging.getLogger(__name__)


class ConvergenceMonitor:
    """Monitor and report convergence, as :class:`hmmlearn.base.ConvergenceMonitor`.

    Parameters
    ----------
    tol : float
        EM has converged when an iteration gains less than ``tol`` in log-likelihood.
    n_iter : int
        Maximum number of iterations.
    verbose : bool
        Print a line per iteration to :data:`sys.stderr`.

    Attributes
    ----------
    history : deque
        The log-likelihood of the data under the model each iteration started from.
    iter : int
        Iterations performed.

    Examples
    --------
    >>> monitor = ConvergenceMonitor(tol=0.1, n_iter=10, verbose=False)
    >>> monitor.report(-10.0); monitor.report(-9.95)
    >>> monitor.converged
    True
    """

    _template = "{iter:>10d} {log_prob:>16.8f} {delta:>+16.8f}"

    def __init__(self, tol: float, n_iter: int, verbose: bool):
        self.tol, self.n_iter, self.verbose = tol, n_iter, verbose
        self.history: deque = deque()
        self.iter = 0

    def __repr__(self) -> str:
        params = sorted(dict(vars(self), history=list(self.history)).items())
        return f"{type(self).__name__}(\n" + "".join(f"    {k}={v},\n" for k, v in params) + ")"

    def _reset(self) -> None:
        self.iter = 0
        self.history.clear()

    def report(self, log_prob: float) -> None:
        """Record one iteration's log-likelihood (and print it when ``verbose``).

        Parameters
        ----------
        log_prob : float
            The log-likelihood of the data under the model the iteration started from.

        Returns
        -------
        None

        Raises
        ------
        Nothing; a fall beyond rounding is logged as hmmlearn logs it.

        Examples
        --------
        >>> ConvergenceMonitor(1e-2, 5, False).report(-3.0)
        """
        if self.verbose:
            delta = log_prob - self.history[-1] if self.history else np.nan
            print(self._template.format(iter=self.iter + 1, log_prob=log_prob, delta=delta), file=sys.stderr)
        precision = np.finfo(float).eps ** (1 / 2)
        if self.history and (log_prob - self.history[-1]) < -precision:
            delta = log_prob - self.history[-1]
            _log.warning(
                f"Model is not converging.  Current: {log_prob} is not greater than {self.history[-1]}. Delta is {delta}"
            )
        self.history.append(log_prob)
        self.iter += 1

    @property
    def converged(self) -> bool:
        """Whether the last iteration reached ``n_iter`` or gained less than ``tol``."""
        return self.iter == self.n_iter or (len(self.history) >= 2 and self.history[-1] - self.history[-2] < self.tol)
