"""The fitted next-token leaf and the estimator that carries the module to train."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from numpy.typing import ArrayLike
from torch import nn

from ..validation import choice

_EVAL_CHUNK = 1024  # contexts per forward when scoring, to bound activation memory


class StreamingTransformerLeaf:
    """A trained next-token model: ``seq_log_density``, ``predict`` and ``generate``.

    The leaf wraps the live module (no copy): further training through the same estimator
    updates it. ``copy.deepcopy`` the leaf to freeze a snapshot.
    """

    def __init__(self, module: nn.Module, device: str | torch.device = "cpu"):
        self.module = module
        self.device = torch.device(device)

    def _logits(self, contexts: ArrayLike) -> torch.Tensor:
        ctx = torch.as_tensor(np.asarray(contexts), dtype=torch.long)
        if ctx.ndim != 2:
            raise ValueError(f"contexts must be (batch, t) token ids, got shape {tuple(ctx.shape)}")
        was_training = self.module.training
        self.module.eval()
        try:
            with torch.no_grad():
                return torch.cat([self.module(chunk.to(self.device)).float().cpu() for chunk in ctx.split(_EVAL_CHUNK)])
        finally:
            self.module.train(was_training)

    def seq_log_density(self, enc: tuple[ArrayLike, ArrayLike]) -> np.ndarray:
        """``log p(next | context)`` for each ``(contexts (b, t), next_tokens (b,))`` pair."""
        contexts, next_tokens = enc
        log_p = F.log_softmax(self._logits(contexts), dim=-1)
        nxt = torch.as_tensor(np.asarray(next_tokens), dtype=torch.long)
        return log_p.gather(1, nxt[:, None])[:, 0].numpy().astype(np.float64)

    def predict(self, contexts: ArrayLike) -> np.ndarray:
        """Most likely next token id for each context."""
        return self._logits(contexts).argmax(dim=-1).numpy()

    def generate(self, prompt_ids: ArrayLike, n: int, temperature: float = 1.0, seed: int = 0) -> np.ndarray:
        """``prompt_ids`` followed by ``n`` sampled ids (``temperature=0`` is greedy)."""
        ids = [int(i) for i in np.asarray(prompt_ids).ravel()]
        if not ids:
            raise ValueError("prompt_ids is empty; give at least one token id to start from")
        block = getattr(self.module, "block", len(ids) + n)
        rng = torch.Generator().manual_seed(seed)
        for _ in range(n):
            logits = self._logits([ids[-block:]])[0]
            if temperature <= 0:
                ids.append(int(logits.argmax()))
            else:
                probs = torch.softmax(logits / temperature, dim=-1)
                ids.append(int(torch.multinomial(probs, 1, generator=rng)))
        return np.asarray(ids, dtype=np.int64)


OPTIMIZERS = ("adamw", "sgd")


class StreamingTransformerLeafEstimator:
    """Carries the module to train, its learning rate, the device to train on and the
    optimizer: ``"adamw"`` (mixle's), or ``"sgd"`` (plain gradient steps), kept as
    ``optimizer_kind`` (mixle's estimator has an ``optimizer`` of its own, an object).

    Plain attributes only, so it pickles (and cloudpickles to engines) with its module.
    """

    def __init__(self, module: nn.Module, lr: float = 3e-3, device: str = "cpu", *, optimizer: str = "adamw"):
        if not isinstance(module, nn.Module):
            raise TypeError(
                f"module must be a torch.nn.Module, got {type(module).__name__}; build one with build_causal_lm(vocab)"
            )
        if not lr > 0:
            raise ValueError(f"lr must be positive, got {lr!r}")
        self.module, self.lr, self.device = module, float(lr), device
        self.optimizer_kind = choice("optimizer", optimizer, OPTIMIZERS)

    def __repr__(self) -> str:
        chosen = "" if self.optimizer_kind == "adamw" else f", optimizer={self.optimizer_kind!r}"
        return (
            f"StreamingTransformerLeafEstimator({type(self.module).__name__}, lr={self.lr}, "
            f"device={self.device!r}{chosen})"
        )
