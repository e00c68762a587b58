"""Hidden Markov models on the EM core: any emission family per state, ragged sequences,
batched forward–backward (log-space or scaled) in torch float64, Viterbi and posterior decoding."""

from .encoding import HiddenMarkovEncoder, PackedBatch, SequenceEncoding
from .forward_backward import IMPLEMENTATIONS, BatchPosteriors, forward_backward
from .gaussian_mixture_emission import gaussian_mixture_arrays, gaussian_mixture_estimator, gaussian_mixture_states
from .model import HiddenMarkovAccumulator, HiddenMarkovDistribution, HiddenMarkovEstimator, states_of_copies

__all__ = [
    "IMPLEMENTATIONS",
    "BatchPosteriors",
    "HiddenMarkovAccumulator",
    "HiddenMarkovDistribution",
    "HiddenMarkovEncoder",
    "HiddenMarkovEstimator",
    "PackedBatch",
    "SequenceEncoding",
    "forward_backward",
    "gaussian_mixture_arrays",
    "gaussian_mixture_estimator",
    "gaussian_mixture_states",
    "states_of_copies",
]
