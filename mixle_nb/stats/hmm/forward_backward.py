"""Forward–backward over one packed batch of sequences, in torch float64.

On the CPU the time loops run compiled (:mod:`.compiled`, numba; ``forward_backward(...,
compiled=False)`` runs the torch pass there too, the reference the tests compare with); the
torch pass below runs on any other device. One loop over time steps updates every running sequence of the batch at once (a ``(K, K) @
(K, n_t)`` product and a few elementwise passes per step); everything that does not recur runs
once over the whole batch before or after the loop: the emission probabilities, the
posteriors ``gamma = alpha * beta`` and the expected transitions, one ``(K, rows) @ (rows, K)``
product. The emission terms and the posteriors are state-major, ``(K, rows)``, as the
emission kernels return them and the emission accumulators read them; a time step is a block
of columns. ``(K, K) @ (K, n_t)`` on that side is several times cheaper than ``(n_t, K) @ (K,
K)`` (measured: 2.5 µs against 20 µs at n_t = 300, K = 8, one thread), the per-step cost that
bounds the whole pass. The scaled pass keeps what its steps touch step-major (each step's
block contiguous) and works a cache-sized chunk of steps at a time (see :func:`_scaled`).
Two implementations, as hmmlearn's:

- ``"scaling"``: probabilities rescaled at each step (``c_t``, each row summing to 1), with
  each observation's emission probabilities taken relative to their largest, so that no
  emission underflows however far an observation lies from every state;
- ``"log"``: log-probabilities, each step's sum over states taken about its row's largest
  term (a log-sum-exp done as one matrix product).
"""

from __future__ import annotations

import gc
import math
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from .encoding import PackedBatch

#: The forward–backward arithmetics: "log" (log-space) and "scaling" (probabilities rescaled
#: every few steps, as hmmlearn's ``implementation="scaling"``).
IMPLEMENTATIONS = ("log", "scaling")
# The scaled forward pass divides by the column sums every this many steps (and derives every
# step's scaling factor afterwards); should a column sum fall below SAFE_SUM between two
# divisions, the batch is run again dividing at every step.
NORMALIZE_EVERY = 4
SAFE_SUM = 1e-200
# Columns x states of the time steps whose emission terms the scaled pass makes at once (1 MB
# of float64 a buffer): they stay in the cache while the steps read them.
CHUNK_ELEMENTS = 1 << 17
LOWEST = torch.finfo(torch.float64).min


@dataclass
class BatchPosteriors:
    """One batch's forward–backward results.

    Parameters
    ----------
    log_likelihood : torch.Tensor
        ``(B,)``: each sequence's log-likelihood, in batch order.
    gamma : torch.Tensor, optional
        ``(K, rows)`` state posteriors (times the sequence weights); the scaled pass's is a
        reused buffer, valid until this thread's next pass.
    start : torch.Tensor, optional
        ``(K,)`` expected (weighted) counts of the first state.
    transitions : torch.Tensor, optional
        ``(K, K)`` expected (weighted) transition counts.

    See Also
    --------
    forward_backward : What returns it.

    Examples
    --------
    >>> import torch
    >>> from mixle_nb.stats.hmm import BatchPosteriors
    >>> BatchPosteriors(torch.tensor([-6.0])).gamma is None  # the forward pass alone
    True
    """

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
    compiled: bool | None = None,
) -> BatchPosteriors:
    """Forward–backward on one packed batch.

    Parameters
    ----------
    batch : PackedBatch
        The batch.
    log_b : torch.Tensor
        ``(K, rows)`` emission log-likelihoods (:meth:`HiddenMarkovDistribution.log_b`).
    startprob : torch.Tensor
        ``(K,)`` first-state probabilities.
    transmat : torch.Tensor
        ``(K, K)`` transition probabilities.
    implementation : {"log", "scaling"}, default "log"
        Log-space arithmetic, or probabilities scaled every few steps (faster).
    weights : torch.Tensor, optional
        ``(B,)`` weights of each sequence's statistics (``None``: 1 each).
    posteriors : bool, default True
        ``False`` runs the forward pass alone (the log-likelihood).
    compiled : bool, optional
        Run the compiled loops of :mod:`.compiled` (CPU tensors only) or the torch pass;
        ``None`` (default): compiled on the CPU, torch on any other device.

    Returns
    -------
    BatchPosteriors
        The log-likelihoods and, with ``posteriors``, the state posteriors and expected counts.

    Raises
    ------
    ValueError
        An unknown ``implementation``, or ``compiled=True`` for tensors off the CPU.

    Examples
    --------
    >>> import torch
    >>> from mixle_nb.stats import GaussianDistribution
    >>> from mixle_nb.stats.hmm import HiddenMarkovDistribution, forward_backward
    >>> hmm = HiddenMarkovDistribution(
    ...     [GaussianDistribution(0.0, 1.0), GaussianDistribution(5.0, 1.0)], [0.5, 0.5], [[0.9, 0.1], [0.2, 0.8]]
    ... )
    >>> batch = hmm.dist_to_encoder().seq_encode([[0.1, 4.9, 5.2], [0.0]]).batches[0]
    >>> log_b, _ = hmm.log_b(batch)
    >>> result = forward_backward(batch, log_b, *hmm.parameters_on(torch.device("cpu")), implementation="scaling")
    >>> result.log_likelihood.round(decimals=4).tolist(), tuple(result.gamma.shape)
    ([-6.0056, -1.6121], (2, 4))
    """
    if implementation not in IMPLEMENTATIONS:
        raise ValueError(f"implementation must be one of {IMPLEMENTATIONS}; got {implementation!r}")
    on_cpu = log_b.device.type == "cpu"
    if compiled and not on_cpu:
        raise ValueError(f"compiled=True runs on CPU tensors; these are on {log_b.device} (pass compiled=None)")
    use_compiled = on_cpu and compiled is not False
    if use_compiled and implementation == "scaling":
        return _compiled_scaled(batch, log_b, startprob, transmat, weights, posteriors)
    # NumPy's warnings off: a chain whose column sums underflow between two divisions makes
    # 0/0 there, which the scaled pass detects and redoes (see ``_scaled``)
    with collection_paused(), np.errstate(under="ignore", divide="ignore", invalid="ignore"):
        if implementation == "scaling":
            return _scaled(batch, log_b, startprob, transmat, weights, posteriors)
        loops = _CompiledLogLoops() if use_compiled else _TorchLogLoops()
        return _logarithmic(batch, log_b, startprob, transmat, weights, posteriors, loops)


def _cpu_buffer(name: str, shape: tuple) -> np.ndarray:
    """:func:`workspace`'s CPU buffer ``name`` of the compiled passes, as a NumPy array."""
    return workspace("compiled " + name, shape, torch.device("cpu")).numpy()


def _compiled_scaled(
    batch: PackedBatch,
    log_b: torch.Tensor,
    startprob: torch.Tensor,
    transmat: torch.Tensor,
    weights: torch.Tensor | None,
    posteriors: bool,
) -> BatchPosteriors:
    """The scaled :func:`forward_backward` through :func:`.scaled_kernel.scaled_pass`, from
    the given emission terms, the posteriors written out."""
    from . import scaled_kernel  # numba's import (0.4 s) when a CPU pass first runs, not with the package

    k, rows = log_b.shape
    gamma = _cpu_buffer("gamma", (k, rows)) if posteriors else np.empty((k, 0))
    emission = scaled_kernel.log_b_emission(log_b.detach().contiguous().numpy())
    log_likelihood, start, transitions = compiled_scaled(
        batch, scaled_kernel.LOG_B, emission, scaled_kernel.GAMMA, gamma, startprob, transmat, weights, posteriors
    )
    if not posteriors:
        return BatchPosteriors(torch.from_numpy(log_likelihood))
    return BatchPosteriors(
        torch.from_numpy(log_likelihood),
        torch.from_numpy(gamma),
        torch.from_numpy(start),
        torch.from_numpy(transitions),
    )


def compiled_scaled(
    batch: PackedBatch,
    source: int,
    emission: tuple,
    target: int,
    statistics: np.ndarray,
    startprob: torch.Tensor,
    transmat: torch.Tensor,
    weights: torch.Tensor | None,
    posteriors: bool = True,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The compiled scaled pass of one CPU batch, its emission terms from ``source`` and its
    posteriors into ``target``'s ``statistics`` (:mod:`.scaled_kernel`): each sequence's
    log-likelihood (B,), the expected starts (K,) and transitions (K, K), each sequence's
    statistics times its ``weights`` (``None``: 1 each)."""
    from . import scaled_kernel

    k, rows = len(startprob), batch.rows
    seq_weights = np.ones(batch.batch) if weights is None else weights.detach().numpy().astype(np.float64)
    with np.errstate(under="ignore", divide="ignore", invalid="ignore"):
        return scaled_kernel.scaled_pass(
            source,
            emission,
            target,
            statistics,
            *_int_steps(batch),
            startprob.detach().numpy(),
            transmat.detach().contiguous().numpy(),
            np.ascontiguousarray(seq_weights),
            posteriors,
            _cpu_buffer("scaled forward", (k * rows,)),
            _cpu_buffer("scale", (rows,)),
        )


def step_views(batch: PackedBatch, tensor: torch.Tensor) -> list[torch.Tensor]:
    """``tensor`` (R, rows)'s columns of each time step, ``(R, n_t)`` views made in bulk: the
    steps with equal ``n_t`` form one ``(R, steps, n)`` view, unbound along time (a slice per
    step costs several times more, and the loop's other work per step is a few microseconds)."""
    views: list[torch.Tensor] = []
    for start, steps, n in batch.segments:
        views.extend(tensor[:, start : start + steps * n].unflatten(1, (steps, n)).unbind(1))
    return views


@contextmanager
def collection_paused() -> Iterator[None]:
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


def _statistics(
    batch: PackedBatch,
    gamma: torch.Tensor,
    forward_prev: torch.Tensor,
    after: torch.Tensor,
    weights: torch.Tensor | None,
    transmat: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
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


_WORKSPACE: dict = {}


def workspace(name: str, shape: tuple, device: torch.device) -> torch.Tensor:
    """A float64 buffer of ``shape`` kept for the next pass of this thread (grown as needed).

    Why: a large batch's lattices are tens of MB, and memory that large comes fresh from the
    operating system at each allocation, each page zeroed on first touch inside the time loop
    (measured: most of a 1,000 x 1,000 scaled pass). What a pass returns in such a buffer
    (``BatchPosteriors.gamma``) is valid until the thread's next pass; :func:`release_workspace`
    frees them all."""
    key = (name, str(device), threading.get_ident())
    size = math.prod(shape)
    found = _WORKSPACE.get(key)
    if found is None or found.numel() < size:
        found = _WORKSPACE[key] = torch.empty(size, dtype=torch.float64, device=device)
    return found[:size].view(shape)


def release_workspace() -> None:
    """Free the buffers :func:`workspace` keeps."""
    _WORKSPACE.clear()


def step_blocks(batch: PackedBatch, flat: torch.Tensor, height: int) -> tuple[list, list]:
    """A step-major buffer: ``flat`` holds, run after run of equal sizes, a ``(steps, height,
    n)`` block; returns each run's block and each step's contiguous ``(height, n)`` view."""
    runs: list[torch.Tensor] = []
    steps: list[torch.Tensor] = []
    for start, length, n in batch.segments:
        block = flat[height * start : height * (start + length * n)].view(length, height, n)
        runs.append(block)
        steps.extend(block.unbind(0))
    return runs, steps


def _loop_views(blocks: list, on_cpu: bool) -> list:
    """The steps of ``(steps, rows, n)`` blocks: NumPy views on the CPU, tensors elsewhere."""
    if on_cpu:
        return [view for block in blocks for view in block.numpy()]
    return [view for block in blocks for view in block.unbind(0)]


def time_chunks(batch: PackedBatch, states: int, elements: int) -> list[tuple[int, int, int, int, int]]:
    """``(run, first step in the run, end step in the run, first column, end column)`` of
    consecutive time steps of one run whose columns x ``states`` stay within ``elements``."""
    chunks = []
    for r, (start, length, n) in enumerate(batch.segments):
        per_chunk = max(1, elements // max(states * n, 1))
        for l0 in range(0, length, per_chunk):
            l1 = min(length, l0 + per_chunk)
            chunks.append((r, l0, l1, start + l0 * n, start + l1 * n))
    return chunks


def _scaled(
    batch: PackedBatch,
    log_b: torch.Tensor,
    startprob: torch.Tensor,
    transmat: torch.Tensor,
    weights: torch.Tensor | None,
    posteriors: bool,
    every: int = NORMALIZE_EVERY,
) -> BatchPosteriors:
    """The scaled pass. The lattices a time step reads and writes are step-major, each step's
    ``(K, n_t)`` block contiguous (a column slice of a (K, rows) array puts its K rows megabytes
    apart, and a small product on such rows measured 3x slower); a chunk of steps' emission
    terms (and, going back, their ``b_t / c_t`` and ``u_t``) are made just before the steps read
    them and stay in the cache; the posteriors come out state-major, as the emission
    accumulators read them."""
    k, n0, rows = log_b.shape[0], int(batch.sizes[0]), batch.rows
    device = log_b.device
    sizes, offsets = batch.sizes.tolist(), batch.offsets.tolist()
    steps = len(sizes)
    segments = batch.segments
    chunks = time_chunks(batch, k, CHUNK_ELEMENTS)
    widest = max(c1 - c0 for _, _, _, c0, c1 in chunks)
    scratch = workspace("scratch", (k * widest,), device)
    peak = workspace("peak", (1, rows), device)
    first_step = [0]
    for _, length, _ in segments:
        first_step.append(first_step[-1] + length)

    def emission_chunk(r: int, l0: int, l1: int, c0: int, c1: int) -> torch.Tensor:
        """``b = exp(log_b - peak)`` of a chunk's steps, step-major (steps, K, n), in scratch."""
        n = segments[r][2]
        b = scratch[: k * (c1 - c0)].view(l1 - l0, k, n)
        source = log_b[:, c0:c1].view(k, l1 - l0, n).permute(1, 0, 2)
        torch.sub(source, peak[:, c0:c1].view(1, l1 - l0, n).permute(1, 0, 2), out=b)
        return exp_(b)

    # forward. Each step's block of z: rows 0..K-1 alpha'' (a multiple of alpha_hat_t), row K
    # at step t >= 1: S_{t-1} = Σ alpha''_{t-1}, made by the step's product itself (transmat's
    # transpose with a row of ones below it). A step is one product and one multiplication by
    # b_t; every ``every``-th step also divides by S_{t-1}, which is all that keeps the values
    # from underflowing (each step shrinks the column sum by c_t, rarely below 1e-3). The
    # scaling factors c_t come after the loop, in bulk, from the column sums.
    torch.amax(log_b, dim=0, keepdim=True, out=peak)
    peak.clamp_(min=LOWEST)
    z_runs, _ = step_blocks(batch, workspace("forward", ((k + 1) * rows,), device), k + 1)
    # each step's alpha'' and S_{t-1} rows as views made in bulk (a view costs a microsecond
    # made one at a time, a fair part of a step)
    alpha_t = [view for block in z_runs for view in block[:, :k].unbind(0)]
    on_cpu = device.type == "cpu"
    # the steps' own work on the CPU through NumPy: its small products and in-place passes
    # cost about half of torch's per call (measured: a (9, 8) @ (8, 1000) product 4.1 µs
    # against 7.2 µs), and a step is a few such calls; the same loop runs on torch tensors
    # on another device
    matmul: Callable[..., Any] = np.matmul if on_cpu else torch.mm
    loop_z = _loop_views([block for block in z_runs], on_cpu)
    loop_alpha = _loop_views([block[:, :k] for block in z_runs], on_cpu)
    loop_sums = _loop_views([block[:, k:] for block in z_runs], on_cpu)
    augmented = torch.cat([transmat.T, torch.ones(1, k, dtype=torch.float64, device=device)])
    loop_augmented: Any = augmented.numpy() if on_cpu else augmented
    loop_start = (startprob.numpy() if on_cpu else startprob)[:, None]
    loop_transmat: Any = transmat.numpy() if on_cpu else transmat
    sums = workspace("sums", (1, rows), device)
    for r, l0, l1, c0, c1 in chunks:
        b_steps = _loop_views([emission_chunk(r, l0, l1, c0, c1)], on_cpu)
        base = first_step[r]
        for local in range(l0, l1):
            t = base + local
            if t == 0:
                loop_alpha[0][...] = b_steps[0] * loop_start
                continue
            n = sizes[t]
            prev = loop_alpha[t - 1] if sizes[t - 1] == n else loop_alpha[t - 1][:, :n]
            matmul(loop_augmented, prev, out=loop_z[t])
            alpha = loop_alpha[t]
            alpha *= b_steps[local - l0]
            if t % every == 0:
                alpha /= loop_sums[t]
        torch.sum(z_runs[r][l0:l1, :k], dim=1, out=sums[0, c0:c1].view(l1 - l0, -1))
    if every > 1 and not bool(sums.min() > SAFE_SUM):  # a chain near-impossible for many steps
        return _scaled(batch, log_b, startprob, transmat, weights, posteriors, every=1)
    # c_t = S_t / S_{t-1}, or S_t where step t divided by S_{t-1}
    c = sums.clone()
    divided = np.repeat(np.arange(steps) % every == 0, sizes)[n0:]
    divisor = sums[:, batch.previous_rows()].clone()
    divisor[:, torch.from_numpy(divided).to(device)] = 1.0
    c[:, n0:].div_(divisor)
    log_c = torch.log(c).add_(peak)[0]
    log_likelihood = torch.zeros(batch.batch, dtype=torch.float64, device=device).index_add_(0, batch.seq_of_row, log_c)
    if not posteriors:
        return BatchPosteriors(log_likelihood)
    # backward, chunk by chunk from the end: u_t = b_t * beta_hat_t / c_t, beta_hat_{t-1} =
    # A u_t, the chunk's beta in the cache (the step before it into ``carry``); each chunk's
    # posteriors gamma = alpha_hat * beta_hat (written state-major) and its transitions
    # Σ alpha_hat_{t-1} u_tᵀ * A
    inverse_sums = sums.reciprocal()
    row_w = None if weights is None else weights[batch.seq_of_row][None, :]
    beta_chunk_flat = workspace("backward", (k * widest,), device)
    carry = workspace("carry", (k, n0), device)  # beta of the step before a chunk
    gamma_out = workspace("gamma", (k, rows), device)
    xi = torch.zeros(k, k, dtype=torch.float64, device=device)
    for r, l0, l1, c0, c1 in reversed(chunks):
        n, base = segments[r][2], first_step[r]
        u = emission_chunk(r, l0, l1, c0, c1)
        u.div_(c[:, c0:c1].view(1, l1 - l0, n).permute(1, 0, 2))  # b / c, times beta below
        beta = beta_chunk_flat[: k * (c1 - c0)].view(l1 - l0, k, n)
        u_steps, beta_steps = _loop_views([u], on_cpu), _loop_views([beta], on_cpu)
        loop_carry: Any = carry.numpy() if on_cpu else carry
        t_last = base + l1 - 1
        if t_last == steps - 1:
            beta[-1].fill_(1.0)  # every sequence ends here
        else:  # the later chunk's first product wrote the running sequences' beta into carry
            m = sizes[t_last + 1]
            beta[-1][:, :m].copy_(carry[:, :m])
            beta[-1][:, m:].fill_(1.0)
        for local in range(l1 - 1, l0 - 1, -1):
            t = base + local
            u_now = u_steps[local - l0]
            u_now *= beta_steps[local - l0]
            if t == 0:
                continue
            # inside a run every step has n columns; before the chunk, into the carry
            matmul(loop_transmat, u_now, out=beta_steps[local - l0 - 1] if local > l0 else loop_carry[:, :n])
        # transitions into the chunk's steps: alpha''_{t-1} (u_t / S_{t-1})ᵀ, weighted
        if l0 == 0 and base > 0:  # the run's first step follows the longer previous run
            t = base
            after = u[0] * inverse_sums[:, offsets[t - 1] : offsets[t - 1] + n]
            if row_w is not None:
                after.mul_(row_w[:, c0 : c0 + n])
            xi.add_(torch.mm(alpha_t[t - 1][:, :n], after.T))
        s0 = max(l0, 1)
        if l1 > s0:
            after = u[s0 - l0 :].mul_(inverse_sums[:, c0 + (s0 - l0 - 1) * n : c1 - n].view(l1 - s0, 1, n))
            if row_w is not None:
                after.mul_(row_w[:, c0 + (s0 - l0) * n : c1].view(l1 - s0, 1, n))
            xi.add_(torch.bmm(z_runs[r][s0 - 1 : l1 - 1, :k], after.transpose(1, 2)).sum(dim=0))
        gamma = gamma_out[:, c0:c1].view(k, l1 - l0, n)
        torch.mul(z_runs[r][l0:l1, :k].permute(1, 0, 2), beta.permute(1, 0, 2), out=gamma)
        gamma.mul_(inverse_sums[:, c0:c1].view(1, l1 - l0, n))
        if row_w is not None:
            gamma.mul_(row_w[:, c0:c1].view(1, l1 - l0, n))
    start = gamma_out[:, :n0].sum(dim=1)
    return BatchPosteriors(log_likelihood, gamma_out, start, xi.mul_(transmat))


class _TorchLogLoops:
    """The log pass's two time loops in torch, one step at a time."""

    def forward(
        self, batch: PackedBatch, log_b: torch.Tensor, log_start: torch.Tensor, transmat: torch.Tensor
    ) -> torch.Tensor:
        """Forward log-variables (K, rows)."""
        k, n0 = log_b.shape[0], int(batch.sizes[0])
        sizes = batch.sizes.tolist()
        transposed = transmat.T.contiguous()
        la = torch.empty_like(log_b)
        torch.add(log_b[:, :n0], log_start[:, None], out=la[:, :n0])
        peak = torch.empty(1, n0, dtype=torch.float64, device=log_b.device)
        work = torch.empty(k, n0, dtype=torch.float64, device=log_b.device)
        la_t, lb_t = step_views(batch, la), step_views(batch, log_b)
        for t in range(1, len(sizes)):
            n = sizes[t]
            prev = la_t[t - 1] if sizes[t - 1] == n else la_t[t - 1][:, :n]
            m, e = peak[:, :n], work[:, :n]
            torch.amax(prev, dim=0, keepdim=True, out=m)
            m.clamp_(min=LOWEST)
            torch.sub(prev, m, out=e).exp_()
            cur = la_t[t]
            torch.mm(transposed, e, out=cur)
            cur.log_().add_(m).add_(lb_t[t])
        return la

    def backward(
        self, batch: PackedBatch, log_b: torch.Tensor, transmat: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Backward log-variables and ``log b + lbeta``, both (K, rows)."""
        k, n0 = log_b.shape[0], int(batch.sizes[0])
        sizes = batch.sizes.tolist()
        peak = torch.empty(1, n0, dtype=torch.float64, device=log_b.device)
        work = torch.empty(k, n0, dtype=torch.float64, device=log_b.device)
        lbeta = torch.zeros_like(log_b)
        after = torch.empty_like(log_b)  # log b_t + log beta_t, for each column
        lb_t, lbeta_t, after_t = step_views(batch, log_b), step_views(batch, lbeta), step_views(batch, after)
        last = len(sizes) - 1
        after_t[last].copy_(lb_t[last])
        for t in range(last, 0, -1):
            n, n_prev = sizes[t], sizes[t - 1]
            m, e = peak[:, :n], work[:, :n]
            w = after_t[t]
            torch.amax(w, dim=0, keepdim=True, out=m)
            m.clamp_(min=LOWEST)
            torch.sub(w, m, out=e).exp_()
            cur = lbeta_t[t - 1] if n == n_prev else lbeta_t[t - 1][:, :n]
            torch.mm(transmat, e, out=cur)
            cur.log_().add_(m)
            torch.add(lb_t[t - 1], lbeta_t[t - 1], out=after_t[t - 1])
        return lbeta, after


class _CompiledLogLoops:
    """The log pass's two time loops compiled (:mod:`.compiled`), on CPU tensors."""

    def forward(
        self, batch: PackedBatch, log_b: torch.Tensor, log_start: torch.Tensor, transmat: torch.Tensor
    ) -> torch.Tensor:
        """Forward log-variables (K, rows)."""
        k = log_b.shape[0]
        from . import compiled

        la = workspace("compiled forward", tuple(log_b.shape), log_b.device)
        compiled.log_forward(
            log_b.detach().contiguous().numpy(),
            *_int_steps(batch),
            log_start.numpy(),
            transmat.detach().contiguous().numpy(),
            la.numpy(),
            np.empty((2 * k + 2, int(batch.sizes[0]))),
        )
        return la

    def backward(
        self, batch: PackedBatch, log_b: torch.Tensor, transmat: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Backward log-variables and ``log b + lbeta``, both (K, rows)."""
        k = log_b.shape[0]
        shape = tuple(log_b.shape)
        lbeta, after = workspace("compiled backward", shape, log_b.device), workspace("after", shape, log_b.device)
        from . import compiled

        compiled.log_backward(
            log_b.detach().contiguous().numpy(),
            *_int_steps(batch),
            transmat.detach().T.contiguous().numpy(),
            lbeta.numpy(),
            after.numpy(),
            np.empty((2 * k + 2, int(batch.sizes[0]))),
        )
        return lbeta, after


def _int_steps(batch: PackedBatch) -> tuple[np.ndarray, np.ndarray]:
    """The batch's ``sizes`` and ``offsets`` as contiguous int64 arrays (the kernels' one type)."""
    return np.ascontiguousarray(batch.sizes, dtype=np.int64), np.ascontiguousarray(batch.offsets, dtype=np.int64)


def _logarithmic(
    batch: PackedBatch,
    log_b: torch.Tensor,
    startprob: torch.Tensor,
    transmat: torch.Tensor,
    weights: torch.Tensor | None,
    posteriors: bool,
    loops: _TorchLogLoops | _CompiledLogLoops,
) -> BatchPosteriors:
    """The log pass: its two time loops from ``loops``, the rest in bulk."""
    n0 = int(batch.sizes[0])
    device = log_b.device
    with torch.no_grad():
        log_start = torch.log(startprob)
    la = loops.forward(batch, log_b, log_start, transmat)
    last_rows = torch.from_numpy(batch.last_rows()).to(device)
    log_likelihood = torch.logsumexp(la[:, last_rows], dim=0)
    if not posteriors:
        return BatchPosteriors(log_likelihood)
    lbeta, after = loops.backward(batch, log_b, transmat)
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
