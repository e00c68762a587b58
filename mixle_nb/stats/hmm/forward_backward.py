"""Forward–backward over one packed batch of sequences, in torch float64.

One loop over time steps updates every running sequence of the batch at once (a ``(n_t, K) @
(K, K)`` product and a few elementwise passes per step); everything that does not recur runs
once over the whole batch before or after the loop: the emission probabilities, the
posteriors ``gamma = alpha * beta`` and the expected transitions, one ``(K, rows) @ (rows, K)``
product. Two implementations, as hmmlearn's:

- ``"scaling"``: probabilities rescaled at each step (``c_t``, each row summing to 1), with
  each observation's emission probabilities taken relative to their largest, so that no
  emission underflows however far an observation lies from every state;
- ``"log"``: log-probabilities, each step's sum over states taken about its row's largest
  term (a log-sum-exp done as one matrix product).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .encoding import PackedBatch

IMPLEMENTATIONS = ("log", "scaling")
LOWEST = torch.finfo(torch.float64).min


@dataclass
class BatchPosteriors:
    """One batch's results: per sequence ``log_likelihood`` (B,) in batch order; when asked for,
    ``gamma`` (rows, K) state posteriors (times the sequence weights), ``start`` (K,) and
    ``transitions`` (K, K) their expected counts (weighted)."""

    log_likelihood: torch.Tensor
    gamma: torch.Tensor | None = None
    start: torch.Tensor | None = None
    transitions: torch.Tensor | None = None


def forward_backward(
    batch: PackedBatch,
    log_b: torch.Tensor,
    startprob: torch.Tensor,
    transmat: torch.Tensor,
    implementation: str = "log",
    weights: torch.Tensor | None = None,
    posteriors: bool = True,
) -> BatchPosteriors:
    """Forward–backward on ``batch`` with emission log-likelihoods ``log_b`` (rows, K).

    ``weights`` (B,) weigh each sequence's statistics (``None``: 1 each); ``posteriors=False``
    runs the forward pass alone (the log-likelihood).
    """
    if implementation == "scaling":
        return _scaled(batch, log_b, startprob, transmat, weights, posteriors)
    if implementation == "log":
        return _logarithmic(batch, log_b, startprob, transmat, weights, posteriors)
    raise ValueError(f"implementation must be one of {IMPLEMENTATIONS}; got {implementation!r}")


def _steps(batch: PackedBatch):
    """``(t, first row, running sequences, previous step's first row)`` for ``t >= 1``."""
    offsets, sizes = batch.offsets.tolist(), batch.sizes.tolist()
    return [(t, offsets[t], sizes[t], offsets[t - 1]) for t in range(1, len(sizes))]


def _row_weights(batch: PackedBatch, weights: torch.Tensor | None) -> torch.Tensor | None:
    return None if weights is None else weights[batch.seq_of_row]


def _statistics(batch, gamma, forward_prev, after, weights, transmat):
    """Expected starts and transitions: from ``gamma``, and for the rows after step 0 from
    ``forward_prev`` (each one's previous forward row) and ``after`` (rows - n0, K), such that
    ``Σ_t xi_t = (forward_prevᵀ after) * A``; each sequence's ``weights`` applied."""
    n0 = int(batch.sizes[0])
    row_w = _row_weights(batch, weights)
    if row_w is not None:
        gamma.mul_(row_w[:, None])
        after.mul_(row_w[n0:, None])
    return gamma[:n0].sum(dim=0), torch.mm(forward_prev.T, after).mul_(transmat)


def _scaled(batch, log_b, startprob, transmat, weights, posteriors) -> BatchPosteriors:
    rows, n0 = batch.rows, int(batch.sizes[0])
    peak = log_b.amax(dim=1, keepdim=True).clamp_(min=LOWEST)
    b = torch.sub(log_b, peak).exp_()
    alpha = torch.empty_like(b)
    c = torch.empty(rows, 1, dtype=torch.float64, device=b.device)
    torch.mul(b[:n0], startprob, out=alpha[:n0])
    torch.sum(alpha[:n0], dim=1, keepdim=True, out=c[:n0])
    alpha[:n0].div_(c[:n0])
    steps = _steps(batch)
    for _, o, n, op in steps:
        cur, scale = alpha[o : o + n], c[o : o + n]
        torch.mm(alpha[op : op + n], transmat, out=cur)
        cur.mul_(b[o : o + n])
        torch.sum(cur, dim=1, keepdim=True, out=scale)
        cur.div_(scale)
    log_c = torch.log(c).add_(peak)[:, 0]
    log_likelihood = torch.zeros(batch.batch, dtype=torch.float64, device=b.device).index_add_(
        0, batch.seq_of_row, log_c
    )
    if not posteriors:
        return BatchPosteriors(log_likelihood)
    bc = b.div_(c)  # b_t / c_t: what the backward step and the transitions read
    beta = torch.ones_like(alpha)
    u = torch.empty_like(alpha)  # u_t = b_t * beta_t / c_t
    last = len(batch.sizes) - 1
    o, n = int(batch.offsets[last]), int(batch.sizes[last])
    u[o : o + n].copy_(bc[o : o + n])
    transposed = transmat.T.contiguous()
    for t, o, n, op in reversed(steps):
        n_prev = int(batch.sizes[t - 1])
        torch.mm(u[o : o + n], transposed, out=beta[op : op + n])
        if t > 1:
            torch.mul(beta[op : op + n_prev], bc[op : op + n_prev], out=u[op : op + n_prev])
    gamma = beta.mul_(alpha)
    start, transitions = _statistics(batch, gamma, alpha[batch.previous_rows()], u[n0:], weights, transmat)
    return BatchPosteriors(log_likelihood, gamma, start, transitions)


def _logarithmic(batch, log_b, startprob, transmat, weights, posteriors) -> BatchPosteriors:
    n0 = int(batch.sizes[0])
    device = log_b.device
    with torch.no_grad():
        log_start = torch.log(startprob)
    la = torch.empty_like(log_b)
    torch.add(log_b[:n0], log_start, out=la[:n0])
    peak = torch.empty(n0, 1, dtype=torch.float64, device=device)
    work = torch.empty(n0, log_b.shape[1], dtype=torch.float64, device=device)
    steps = _steps(batch)
    for _, o, n, op in steps:
        prev, m, e = la[op : op + n], peak[:n], work[:n]
        torch.amax(prev, dim=1, keepdim=True, out=m)
        m.clamp_(min=LOWEST)
        torch.sub(prev, m, out=e).exp_()
        cur = la[o : o + n]
        torch.mm(e, transmat, out=cur)
        cur.log_().add_(m).add_(log_b[o : o + n])
    last = torch.from_numpy(batch.last_rows()).to(device)
    log_likelihood = torch.logsumexp(la[last], dim=1)
    if not posteriors:
        return BatchPosteriors(log_likelihood)
    lbeta = torch.zeros_like(la)
    after = torch.empty_like(la)  # log b_t + log beta_t, for each row
    transposed = transmat.T.contiguous()
    last_step = len(batch.sizes) - 1
    o, n = int(batch.offsets[last_step]), int(batch.sizes[last_step])
    after[o : o + n].copy_(log_b[o : o + n])
    for t, o, n, op in reversed(steps):
        w, m, e = after[o : o + n], peak[:n], work[:n]
        torch.amax(w, dim=1, keepdim=True, out=m)
        m.clamp_(min=LOWEST)
        torch.sub(w, m, out=e).exp_()
        cur = lbeta[op : op + n]
        torch.mm(e, transposed, out=cur)
        cur.log_().add_(m)
        n_prev = int(batch.sizes[t - 1])
        torch.add(log_b[op : op + n_prev], lbeta[op : op + n_prev], out=after[op : op + n_prev])
    ll_row = log_likelihood[batch.seq_of_row][:, None]
    gamma = torch.add(la, lbeta).sub_(ll_row).exp_()
    # xi_t(i, j) = exp(la_{t-1,i} + log A_ij + after_t,j - ll): each factor about its row's
    # largest term, the shifts put back on the ``after`` side
    prev_rows = batch.previous_rows()
    la_prev = la[prev_rows]
    m1 = la_prev.amax(dim=1, keepdim=True).clamp_(min=LOWEST)
    forward = la_prev.sub_(m1).exp_()
    tail = after[n0:]
    m2 = tail.amax(dim=1, keepdim=True).clamp_(min=LOWEST)
    shift = (m1 + m2 - ll_row[n0:]).exp_()
    tail = tail.sub_(m2).exp_().mul_(shift)
    start, transitions = _statistics(batch, gamma, forward, tail, weights, transmat)
    return BatchPosteriors(log_likelihood, gamma, start, transitions)
