"""hmmlearn's ``hmmlearn.hmm`` face on our HMM family (:mod:`mixle_nb.stats.hmm`), as
:mod:`mixle_nb.mixture` is scikit-learn's: hmmlearn's signatures, defaults, ``params`` /
``init_params``, ``lengths``, fitted attributes, warnings and errors; ``fit`` also takes a
handle of sequences. scikit-learn is needed here (``pip install 'mixle_nb[sklearn]'``)."""

from .base import BaseHMM
from .categorical import CategoricalHMM
from .gaussian import GaussianHMM
from .gmm import GMMHMM
from .monitor import ConvergenceMonitor
from .poisson import PoissonHMM

__all__ = ["GMMHMM", "BaseHMM", "CategoricalHMM", "ConvergenceMonitor", "GaussianHMM", "PoissonHMM"]
