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

    Parameters
    ----------
    module : torch.nn.Module
        The model (a :class:`CausalLM`, or mixle's): ``(batch, t)`` ids to next-token logits.
    device : str or torch.device, default "cpu"
        Where the module runs.

    See Also
    --------
    StreamingTransformerLeafEstimator : What training returns it from.

    Examples
    --------
    >>> from mixle_nb.neural import StreamingTransformerLeaf, build_causal_lm
    >>> leaf = StreamingTransformerLeaf(build_causal_lm(vocab=8, d_model=16, n_layer=1, n_head=2, block=4))
    >>> leaf.predict([[1, 2, 3]]).shape, leaf.seq_log_density(([[1, 2, 3]], [4])).shape
    ((1,), (1,))
    >>> len(leaf.generate([1], 5, temperature=0))
    6
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
        """``log p(next | context)`` for each context and next token.

        Parameters
        ----------
        enc : tuple of array_like
            ``(contexts (b, t), next_tokens (b,))`` token ids.

        Returns
        -------
        numpy.ndarray
            ``(b,)`` float64 log-probabilities.

        Raises
        ------
        ValueError
            Contexts that are not ``(batch, t)`` ids.
        """
        contexts, next_tokens = enc
        log_p = F.log_softmax(self._logits(contexts), dim=-1)
        nxt = torch.as_tensor(np.asarray(next_tokens), dtype=torch.long)
        return log_p.gather(1, nxt[:, None])[:, 0].numpy().astype(np.float64)

    def predict(self, contexts: ArrayLike) -> np.ndarray:
        """The most likely next token id of each context.

        Parameters
        ----------
        contexts : array_like of int
            ``(b, t)`` token ids.

        Returns
        -------
        numpy.ndarray
            ``(b,)`` token ids.

        Raises
        ------
        ValueError
            Contexts that are not ``(batch, t)`` ids.
        """
        return self._logits(contexts).argmax(dim=-1).numpy()

    def generate(self, prompt_ids: ArrayLike, n: int, temperature: float = 1.0, seed: int = 0) -> np.ndarray:
        """``prompt_ids`` followed by ``n`` sampled ids.

        Parameters
        ----------
        prompt_ids : array_like of int
            The prompt, at least one id.
        n : int
            How many ids to sample.
        temperature : float, default 1.0
            Divides the logits before sampling; 0 (or less) is greedy.
        seed : int, default 0
            The seed of the sampling.

        Returns
        -------
        numpy.ndarray
            ``len(prompt_ids) + n`` int64 ids.

        Raises
        ------
        ValueError
            An empty prompt.
        """
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
    """Carries the module to train, its learning rate, its device and the optimizer.

    Plain attributes only, so it pickles (and cloudpickles to engines) with its module. Training
    runs in :class:`~mixle_nb.parallel.StreamingTokenEncodedData`'s ``pysp_seq_estimate``, which
    returns a :class:`StreamingTransformerLeaf`.

    Parameters
    ----------
    module : torch.nn.Module
        The model to train.
    lr : float, default 3e-3
        The learning rate, > 0.
    device : str, default "cpu"
        Where to train.
    optimizer : {"adamw", "sgd"}, default "adamw"
        AdamW (mixle's), or plain gradient steps; kept as ``optimizer_kind`` (mixle's estimator
        has an ``optimizer`` of its own, an object).

    Raises
    ------
    TypeError
        ``module`` is not a ``torch.nn.Module``.
    ValueError
        ``lr`` is not positive, or an unknown ``optimizer``.

    Examples
    --------
    >>> from mixle_nb.neural import StreamingTransformerLeafEstimator, build_causal_lm
    >>> StreamingTransformerLeafEstimator(build_causal_lm(vocab=8, d_model=16, n_head=2), lr=1e-2, optimizer="sgd")
    StreamingTransformerLeafEstimator(CausalLM, lr=0.01, device='cpu', optimizer='sgd')
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
