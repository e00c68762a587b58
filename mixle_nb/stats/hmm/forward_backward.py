"""Forward–backward over one packed batch of sequences, in torch float64.

One loop over time steps updates every running sequence of the batch at once (a ``(K, K) @
(K, n_t)`` product and a few elementwise passes per step); everything that does not recur runs
once over the whole batch before or after the loop: the emission probabilities, the
posteriors ``gamma = alpha * beta`` and the expected transitions, one ``(K, rows) @ (rows, K)``
product. The lattices are state-major, ``(K, rows)`` as the emission kernels return them and
the emission accumulators read them: a time step is a block of columns, and the small matrix
product on that side is several times cheaper than ``(n_t, K) @ (K, K)`` (measured: 2.5 µs
against 20 µs at n_t = 300, K = 8, one thread), the per-step cost that bounds the whole pass.
Two implementations, as hmmlearn's:

- ``"scaling"``: probabilities rescaled at each step (``c_t``, each row summing to 1), with
  each observation's emission probabilities taken relative to their largest, so that no
  emission underflows however far an observation lies from every state;
- ``"log"``: log-probabilities, each step's sum over states taken about its row's largest
  term (a log-sum-exp done as one matrix product).
"""

from __future__ import annotations

import gc
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import torch

from .encoding import PackedBatch

IMPLEMENTATIONS = ("log", "scaling")
# The scaled forward pass divides by the column sums every this many steps (and derives every
# step's scaling factor afterwards); should a column sum fall below SAFE_SUM between two
# divisions, the batch is run again dividing at every step.
NORMALIZE_EVERY = 4
SAFE_SUM = 1e-200
LOWEST = torch.finfo(torch.float64).min


@dataclass
class BatchPosteriors:
    """One batch's results: per sequence ``log_likelihood`` (B,) in batch order; when asked for,
    ``gamma`` (K, rows) state posteriors (times the sequence weights), ``start`` (K,) and
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
    """Forward–backward on ``batch`` with emission log-likelihoods ``log_b`` (K, rows).

    ``weights`` (B,) weigh each sequence's statistics (``None``: 1 each); ``posteriors=False``
    runs the forward pass alone (the log-likelihood).
    """
    if implementation not in IMPLEMENTATIONS:
        raise ValueError(f"implementation must be one of {IMPLEMENTATIONS}; got {implementation!r}")
    with collection_paused():
        if implementation == "scaling":
            return _scaled(batch, log_b, startprob, transmat, weights, posteriors)
        return _logarithmic(batch, log_b, startprob, transmat, weights, posteriors)


def step_views(batch: PackedBatch, tensor: torch.Tensor) -> list[torch.Tensor]:
    """``tensor`` (R, rows)'s columns of each time step, ``(R, n_t)`` views made in bulk: the
    steps with equal ``n_t`` form one ``(R, steps, n)`` view, unbound along time (a slice per
    step costs several times more, and the loop's other work per step is a few microseconds)."""
    views: list[torch.Tensor] = []
    for start, steps, n in batch.segments:
        views.extend(tensor[:, start : start + steps * n].unflatten(1, (steps, n)).unbind(1))
    return views


@contextmanager
def collection_paused():
    """Python's cyclic garbage collector off while a pass makes its thousands of small tensor
    views: none of them is in a cycle, and a collection every few hundred allocations walks
    every tracked object of the process (measured: a third of a scaled E-step's time)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _statistics(batch, gamma, forward_prev, after, weights, transmat):
    """Expected starts and transitions: from ``gamma``, and for the columns after step 0 from
    ``forward_prev`` (each one's previous forward column) and ``after`` (K, rows - n0), such
    that ``Σ_t xi_t = (forward_prev afterᵀ) * A``; each sequence's ``weights`` applied."""
    n0 = int(batch.sizes[0])
    if weights is not None:
        row_w = weights[batch.seq_of_row]
        gamma.mul_(row_w)
        after.mul_(row_w[n0:])
    return gamma[:, :n0].sum(dim=1), torch.mm(forward_prev, after.T).mul_(transmat)


def exp_(values: torch.Tensor) -> torch.Tensor:
    """``values.exp_()``; on the CPU through NumPy, whose vectorised float64 exp is about twice
    torch's (measured: 1.0 ms against 2.0 ms for 1.2e6 values, one thread)."""
    if values.device.type == "cpu" and values.is_contiguous():
        array = values.numpy()
        np.exp(array, out=array)
        return values
    return values.exp_()


def _scaled(batch, log_b, startprob, transmat, weights, posteriors, every=NORMALIZE_EVERY) -> BatchPosteriors:
    k, n0 = log_b.shape[0], int(batch.sizes[0])
    device = log_b.device
    sizes = batch.sizes.tolist()
    peak = log_b.amax(dim=0, keepdim=True).clamp_(min=LOWEST)
    b = exp_(torch.sub(log_b, peak))
    # rows 0..K-1: the forward variables alpha'', column t a multiple of alpha_hat_t; row K at
    # step t >= 1: S_{t-1} = Σ alpha''_{t-1}, made by the step's product itself (transmat's
    # transpose with a row of ones below it). A step is one product and one multiplication by
    # b_t; every ``every``-th step also divides by S_{t-1}, which is all that keeps the values
    # from underflowing (each step shrinks the column sum by c_t, rarely below 1e-3). The
    # scaling factors c_t come after the loop, in bulk, from the column sums.
    z = torch.empty(k + 1, batch.rows, dtype=torch.float64, device=device)
    augmented = torch.cat([transmat.T, torch.ones(1, k, dtype=torch.float64, device=device)])
    alpha = z[:k]
    torch.mul(b[:, :n0], startprob[:, None], out=alpha[:, :n0])
    z_t, alpha_t, sums_t, b_t = (step_views(batch, x) for x in (z, alpha, z[k:], b))
    for t in range(1, len(sizes)):
        n = sizes[t]
        prev = alpha_t[t - 1] if sizes[t - 1] == n else alpha_t[t - 1][:, :n]
        torch.mm(augmented, prev, out=z_t[t])
        alpha_t[t].mul_(b_t[t])
        if t % every == 0:
            alpha_t[t].div_(sums_t[t])
    # S_t: the next step's product made it (row K) for every column but each sequence's last
    sums = torch.empty(1, batch.rows, dtype=torch.float64, device=device)
    sums[:, batch.previous_rows()] = z[k:, n0:]
    last_rows = torch.from_numpy(batch.last_rows()).to(device)
    sums[:, last_rows] = alpha[:, last_rows].sum(dim=0)
    if every > 1 and not bool(sums.min() > SAFE_SUM):  # a chain near-impossible for many steps
        return _scaled(batch, log_b, startprob, transmat, weights, posteriors, every=1)
    # c_t = S_t / S_{t-1}, or S_t where step t divided by S_{t-1}
    divisor = z[k:].clone()
    divisor[:, :n0] = 1.0
    divided = np.repeat(np.arange(len(sizes)) % every == 0, sizes)
    divided[:n0] = False
    divisor[:, torch.from_numpy(divided).to(device)] = 1.0
    c = sums.div(divisor)
    log_c = torch.log(c).add_(peak)[0]
    log_likelihood = torch.zeros(batch.batch, dtype=torch.float64, device=device).index_add_(0, batch.seq_of_row, log_c)
    if not posteriors:
        return BatchPosteriors(log_likelihood)
    alpha.div_(sums)
    bc = b.div_(c)  # b_t / c_t: what the backward step and the transitions read
    beta = torch.empty(k, batch.rows, dtype=torch.float64, device=device)
    beta[:, last_rows] = 1.0  # every other column is written by the backward product
    u = torch.empty_like(beta)  # u_t = b_t * beta_hat_t / c_t
    beta_t, u_t, bc_t = (step_views(batch, x) for x in (beta, u, bc))
    last = len(sizes) - 1
    u_t[last].copy_(bc_t[last])
    for t in range(last, 0, -1):
        n, n_prev = sizes[t], sizes[t - 1]
        torch.mm(transmat, u_t[t], out=beta_t[t - 1] if n == n_prev else beta_t[t - 1][:, :n])
        if t > 1:
            torch.mul(beta_t[t - 1], bc_t[t - 1], out=u_t[t - 1])
    gamma = beta.mul_(alpha)
    start, transitions = _statistics(batch, gamma, alpha[:, batch.previous_rows()], u[:, n0:], weights, transmat)
    return BatchPosteriors(log_likelihood, gamma, start, transitions)


def _logarithmic(batch, log_b, startprob, transmat, weights, posteriors) -> BatchPosteriors:
    k, n0 = log_b.shape[0], int(batch.sizes[0])
    device = log_b.device
    sizes = batch.sizes.tolist()
    with torch.no_grad():
        log_start = torch.log(startprob)
    transposed = transmat.T.contiguous()
    la = torch.empty_like(log_b)
    torch.add(log_b[:, :n0], log_start[:, None], out=la[:, :n0])
    peak = torch.empty(1, n0, dtype=torch.float64, device=device)
    work = torch.empty(k, n0, dtype=torch.float64, device=device)
    buffers: dict = {}

    def scratch(n: int):
        if n not in buffers:
            buffers[n] = (peak[:, :n], work[:, :n])
        return buffers[n]

    la_t, lb_t = step_views(batch, la), step_views(batch, log_b)
    for t in range(1, len(sizes)):
        n = sizes[t]
        prev = la_t[t - 1] if sizes[t - 1] == n else la_t[t - 1][:, :n]
        m, e = scratch(n)
        torch.amax(prev, dim=0, keepdim=True, out=m)
        m.clamp_(min=LOWEST)
        torch.sub(prev, m, out=e).exp_()
        cur = la_t[t]
        torch.mm(transposed, e, out=cur)
        cur.log_().add_(m).add_(lb_t[t])
    last_rows = torch.from_numpy(batch.last_rows()).to(device)
    log_likelihood = torch.logsumexp(la[:, last_rows], dim=0)
    if not posteriors:
        return BatchPosteriors(log_likelihood)
    lbeta = torch.zeros_like(la)
    after = torch.empty_like(la)  # log b_t + log beta_t, for each column
    lbeta_t, after_t = step_views(batch, lbeta), step_views(batch, after)
    last = len(sizes) - 1
    after_t[last].copy_(lb_t[last])
    for t in range(last, 0, -1):
        n, n_prev = sizes[t], sizes[t - 1]
        m, e = scratch(n)
        w = after_t[t]
        torch.amax(w, dim=0, keepdim=True, out=m)
        m.clamp_(min=LOWEST)
        torch.sub(w, m, out=e).exp_()
        cur = lbeta_t[t - 1] if n == n_prev else lbeta_t[t - 1][:, :n]
        torch.mm(transmat, e, out=cur)
        cur.log_().add_(m)
        torch.add(lb_t[t - 1], lbeta_t[t - 1], out=after_t[t - 1])
    ll_row = log_likelihood[batch.seq_of_row]
    gamma = torch.add(la, lbeta).sub_(ll_row).exp_()
    # xi_t(i, j) = exp(la_{t-1,i} + log A_ij + after_t,j - ll): each factor about its column's
    # largest term, the shifts put back on the ``after`` side
    la_prev = la[:, batch.previous_rows()]
    m1 = la_prev.amax(dim=0, keepdim=True).clamp_(min=LOWEST)
    forward = la_prev.sub_(m1).exp_()
    tail = after[:, n0:]
    m2 = tail.amax(dim=0, keepdim=True).clamp_(min=LOWEST)
    shift = (m1 + m2 - ll_row[n0:]).exp_()
    tail = tail.sub_(m2).exp_().mul_(shift)
    start, transitions = _statistics(batch, gamma, forward, tail, weights, transmat)
    return BatchPosteriors(log_likelihood, gamma, start, transitions)
