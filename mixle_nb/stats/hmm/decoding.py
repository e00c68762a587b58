"""Viterbi decoding over one packed batch of sequences: one max-plus step per time step for
every running sequence, back-pointers (rows, K), then one gather per step back."""

from __future__ import annotations

import torch

from .encoding import PackedBatch
from .forward_backward import collection_paused

LOWEST = torch.finfo(torch.float64).min


def viterbi(
    batch: PackedBatch, log_b: torch.Tensor, startprob: torch.Tensor, transmat: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Each sequence's most likely state path, from emission log-likelihoods ``log_b`` (K,
    rows): its log-probability (B,) in batch order and the state of every packed row (rows,)."""
    with collection_paused():
        return _viterbi(batch, log_b, startprob, transmat)


def _viterbi(
    batch: PackedBatch, log_b: torch.Tensor, startprob: torch.Tensor, transmat: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    device = log_b.device
    with torch.no_grad():
        log_start, log_trans = torch.log(startprob), torch.log(transmat)
    delta = torch.empty_like(log_b)
    pointers = torch.zeros(log_b.shape, dtype=torch.int64, device=device)
    n0 = int(batch.sizes[0])
    torch.add(log_b[:, :n0], log_start[:, None], out=delta[:, :n0])
    offsets, sizes = batch.offsets.tolist(), batch.sizes.tolist()
    from_to = log_trans[:, :, None]
    for t in range(1, len(sizes)):
        o, n, op = offsets[t], sizes[t], offsets[t - 1]
        best, arg = (delta[:, None, op : op + n] + from_to).max(dim=0)  # (from, to, n) -> (to, n)
        torch.add(best, log_b[:, o : o + n], out=delta[:, o : o + n])
        pointers[:, o : o + n] = arg
    last = torch.from_numpy(batch.last_rows()).to(device)
    final, state = delta[:, last].max(dim=0)
    path = torch.empty(batch.rows, dtype=torch.int64, device=device)
    state = state.clone()
    for t in range(len(sizes) - 1, 0, -1):
        o, n = offsets[t], sizes[t]
        path[o : o + n] = state[:n]
        state[:n] = pointers[:, o : o + n].gather(0, state[None, :n])[0]
    path[:n0] = state
    return final, path
