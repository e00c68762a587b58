"""Drivers over the ``seq_*`` dispatch: batch EM (:func:`fit`, :func:`optimize`) with its
starts and restarts, model choice (:func:`bic`, :func:`aic`, :func:`choose_k`), labels
(:func:`predict`, :func:`predict_proba`, :func:`score_samples`) and streaming statistics.

Each takes local data or any handle as its first argument; on a handle the work runs where the
shards live. Progress lines are printed on the root rank only (``out=ROOT_STDOUT``, the
default): a handle's root, or for local data rank 0 of the torch.distributed group (or of
torchrun's ``RANK``), so that every rank running the same cell prints once.

One concept a module: ``fitting`` (the EM loop, its stopping rule and checkpoints),
``starts`` (where EM starts), ``model_choice`` (BIC, AIC, choosing K) and
``scoring`` (per-observation answers); every name is imported from here."""

from .fitting import (
    DEFAULT_DELTA,
    ROOT_STDOUT,
    FitError,
    FitResult,
    fit,
    optimize,
    stopping_tolerance,
    streaming_accumulate,
)
from .model_choice import KChoice, aic, bic, choose_k
from .scoring import predict, predict_proba, score_samples
from .starts import GAUSSIAN_FAMILY, INITS, default_init, initial_model

__all__ = [
    "DEFAULT_DELTA",
    "GAUSSIAN_FAMILY",
    "INITS",
    "ROOT_STDOUT",
    "FitError",
    "FitResult",
    "KChoice",
    "aic",
    "bic",
    "choose_k",
    "default_init",
    "fit",
    "initial_model",
    "optimize",
    "predict",
    "predict_proba",
    "score_samples",
    "stopping_tolerance",
    "streaming_accumulate",
]
