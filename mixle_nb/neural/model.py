"""A small decoder-only transformer that maps a token context to next-token logits."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention through ``scaled_dot_product_attention``."""

    def __init__(self, d_model: int, n_head: int):
        super().__init__()
        self.n_head = n_head
        # No bias: a key bias has zero gradient (softmax ignores a per-query shift), so Adam
        # would amplify rounding noise in it into updates of size lr.
        self.qkv = nn.Linear(d_model, 3 * d_model, bias=False)
        self.proj = nn.Linear(d_model, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.n_head, d // self.n_head).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, t, d))


class TransformerBlock(nn.Module):
    """Pre-norm residual block: attention then a 4x GELU MLP."""

    def __init__(self, d_model: int, n_head: int):
        super().__init__()
        self.ln1 = nn.LayerNorm(d_model)
        self.attn = CausalSelfAttention(d_model, n_head)
        self.ln2 = nn.LayerNorm(d_model)
        self.mlp = nn.Sequential(nn.Linear(d_model, 4 * d_model), nn.GELU(), nn.Linear(4 * d_model, d_model))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class CausalLM(nn.Module):
    """A small decoder-only transformer: token context to next-token logits.

    Token and position embeddings, pre-norm transformer blocks (causal self-attention, then a
    4x GELU MLP), a final LayerNorm and a next-token head. ``forward(contexts)`` takes
    ``(batch, t)`` token ids with ``t <= block`` and returns the ``(batch, vocab)`` logits of the
    token that follows each context (only the last position goes through the head).
    ``forward(contexts, return_all_logits=True)`` returns the ``(batch, t, vocab)`` logits of
    every position: position ``j`` predicts the token after ``contexts[:, :j + 1]`` (the causal
    mask hides the rest), which is how training takes the loss at every position of a window.
    The keyword is mixle's ``CausalLM`` spelling, so the streaming handle trains either module.
    Setting ``activation_checkpointing`` recomputes each block in backward instead of storing its
    activations.

    Parameters
    ----------
    vocab : int
        The number of token ids.
    d_model : int
        The width of the embeddings and blocks.
    n_layer : int
        The number of transformer blocks.
    n_head : int
        Attention heads per block (dividing ``d_model``).
    block : int
        The longest context.

    See Also
    --------
    build_causal_lm : Builds one from a seed, checking the arguments.

    Examples
    --------
    >>> import torch
    >>> from mixle_nb.neural import CausalLM
    >>> lm = CausalLM(vocab=8, d_model=16, n_layer=1, n_head=2, block=4)
    >>> contexts = torch.tensor([[1, 2, 3]])
    >>> tuple(lm(contexts).shape), tuple(lm(contexts, return_all_logits=True).shape)
    ((1, 8), (1, 3, 8))
    """

    def __init__(self, vocab: int, d_model: int, n_layer: int, n_head: int, block: int):
        super().__init__()
        self.vocab, self.block = vocab, block
        self.tok_emb = nn.Embedding(vocab, d_model)
        self.pos_emb = nn.Embedding(block, d_model)
        self.blocks = nn.ModuleList(TransformerBlock(d_model, n_head) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab, bias=False)
        self.activation_checkpointing = False

    def forward(self, contexts: torch.Tensor, *, return_all_logits: bool = False) -> torch.Tensor:
        """The logits of the token after each context, or after every position.

        Parameters
        ----------
        contexts : torch.Tensor
            ``(batch, t)`` token ids, ``t <= block``.
        return_all_logits : bool, default False
            Return every position's logits (position ``j`` predicts the token after
            ``contexts[:, :j + 1]``), as training needs; mixle's ``CausalLM`` spelling.

        Returns
        -------
        torch.Tensor
            ``(batch, vocab)`` logits, or ``(batch, t, vocab)`` with ``return_all_logits``.

        Raises
        ------
        ValueError
            A context longer than ``block``.
        """
        t = contexts.shape[1]
        if t > self.block:
            raise ValueError(
                f"context length {t} exceeds the model's block {self.block}; crop contexts to the last `block` tokens"
            )
        x = self.tok_emb(contexts) + self.pos_emb.weight[:t]
        recompute = self.activation_checkpointing and torch.is_grad_enabled()
        for blk in self.blocks:
            x = checkpoint(blk, x, use_reentrant=False) if recompute else blk(x)
        return self.head(self.ln_f(x if return_all_logits else x[:, -1]))


def build_causal_lm(
    vocab: int, d_model: int = 128, n_layer: int = 4, n_head: int = 4, block: int = 64, *, seed: int = 0
) -> CausalLM:
    """Build a :class:`CausalLM` whose initial parameters depend only on ``seed``.

    The global torch RNG is left untouched, so every rank that calls this with the same
    arguments holds an identical model without a broadcast.

    Parameters
    ----------
    vocab : int
        The number of token ids.
    d_model : int, default 128
        The width of the embeddings and blocks.
    n_layer : int, default 4
        The number of transformer blocks.
    n_head : int, default 4
        Attention heads per block (dividing ``d_model``).
    block : int, default 64
        The longest context.
    seed : int, default 0
        The seed of the initial parameters.

    Returns
    -------
    CausalLM
        The model, in training mode.

    Raises
    ------
    ValueError
        A size that is not a positive int, or ``d_model`` not divisible by ``n_head``.

    Examples
    --------
    >>> import torch
    >>> from mixle_nb.neural import build_causal_lm
    >>> a = build_causal_lm(vocab=8, d_model=16, n_layer=1, n_head=2, block=4, seed=0)
    >>> b = build_causal_lm(vocab=8, d_model=16, n_layer=1, n_head=2, block=4, seed=0)
    >>> all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
    True
    >>> build_causal_lm(vocab=8, d_model=16, n_head=3)
    Traceback (most recent call last):
    ...
    ValueError: d_model=16 must be divisible by n_head=3; pick n_head among the divisors of d_model
    """
    for name, value in (
        ("vocab", vocab),
        ("d_model", d_model),
        ("n_layer", n_layer),
        ("n_head", n_head),
        ("block", block),
    ):
        if not isinstance(value, int) or value <= 0:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    if d_model % n_head:
        raise ValueError(
            f"d_model={d_model} must be divisible by n_head={n_head}; pick n_head among the divisors of d_model"
        )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return CausalLM(vocab, d_model, n_layer, n_head, block)
