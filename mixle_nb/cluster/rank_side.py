"""Functions the panels run on every rank. They find the handle, estimator and model by the
names they have in the rank's namespace (where ``push``/``%mixle_push`` put them).

They run on the engines, so this module imports neither ipywidgets nor matplotlib."""

from __future__ import annotations

import contextlib
import contextvars
import functools
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import ArrayLike

if TYPE_CHECKING:
    import torch

    from ..stats.base import Distribution

# A namespace of LocalRanks (a panel without a cluster) and where its calls publish, while one runs
_local_namespace: contextvars.ContextVar[dict | None] = contextvars.ContextVar("mixle_local_namespace", default=None)
_local_publish: contextvars.ContextVar[Callable[[dict], None] | None] = contextvars.ContextVar(
    "mixle_local_publish", default=None
)


@contextlib.contextmanager
def in_namespace(namespace: dict, publish: Callable[[dict], None] = lambda data: None) -> Iterator[None]:
    """Run the rank functions against ``namespace`` (this thread, meanwhile); what they
    :func:`publish` goes to ``publish``."""
    tokens = _local_namespace.set(namespace), _local_publish.set(publish)
    try:
        yield
    finally:
        _local_namespace.reset(tokens[0])
        _local_publish.reset(tokens[1])


def publish(data: dict) -> None:
    """Send ``data`` to the client while the call runs, without a collective: through
    ipyparallel's data channel on an engine, to the receiver of :func:`in_namespace` here."""
    local = _local_publish.get()
    if local is not None:
        local(data)
        return
    from ipyparallel.datapub import publish_data

    publish_data(data)


def rank_namespace() -> dict:
    """The engine's user namespace (``__main__`` outside IPython), or the namespace of
    :func:`in_namespace`."""
    local = _local_namespace.get()
    if local is not None:
        return local
    try:
        from IPython import get_ipython

        shell = get_ipython()
    except ImportError:
        shell = None
    if shell is not None:
        return shell.user_ns
    import __main__

    return __main__.__dict__


def lookup(name: str) -> Any:
    namespace = rank_namespace()
    if name not in namespace:
        raise NameError(
            f"{name!r} is not defined on this rank: push it (%mixle_push {name}), or if "
            "it was built on the ranks (a handle), build it there again: a restart "
            "leaves the ranks empty"
        )
    return namespace[name]


def em_step_on_rank(handle: str, estimator: str, model: str) -> Any:
    """One EM step on this rank's resident shard, its :class:`~mixle_nb.stats.EMStep` carrying
    this rank's E-step seconds (``rank_seconds``) and whole step's (``step_s``); the new model
    replaces ``model`` here."""
    from ..stats.estimation import em_step

    t0 = time.perf_counter()
    h = lookup(handle)
    step = em_step(h, lookup(estimator), lookup(model))
    rank_namespace()[model] = step.model
    timings = getattr(h, "last_timings", None)
    step.step_s = time.perf_counter() - t0
    step.rank_seconds = [timings.e_step_s if timings is not None else step.step_s]
    return step


def check_elastic_on_rank(handle: str, training: bool = False) -> None:
    """Raise, before any step, unless the handle ``handle`` can go on after a rank dies (in EM,
    or with ``training`` in streaming training)."""
    h = lookup(handle)
    if training:
        if not hasattr(h, "check_elastic"):
            raise ValueError(
                f"{handle!r} (a {type(h).__name__}) is not a streaming token handle: "
                "TrainPanel trains a StreamingTokenEncodedData"
            )
        try:
            h.check_elastic()
        except ValueError as exc:
            raise ValueError(f"{handle!r}: {exc}") from None
        return
    if getattr(h, "elastic", False) and hasattr(h, "rejoin"):
        return
    if hasattr(h, "rejoin") and not getattr(h, "rereadable", False):
        from ..parallel.data_sources import NOT_ELASTIC

        raise ValueError(f"{handle!r}: " + NOT_ELASTIC.format(what="its data (passed from memory)"))
    if hasattr(h, "rejoin"):
        raise ValueError(
            f"{handle!r} was built without elastic=True: build it again with "
            "from_npy/from_files(..., elastic=True), then attach the panel"
        )
    raise ValueError(
        f"{handle!r} (a {type(h).__name__}) cannot go on after a rank dies: elastic recovery covers "
        "EM handles read from files (TorchRunEncodedData.from_npy/from_files(..., elastic=True)). "
        "Streaming training goes on from its newest checkpoint with TrainPanel(..., elastic=True)"
    )


def rejoin_on_rank(handle: str) -> list:
    """The elastic handle ``handle`` goes on in the group the survivors formed, reading the lost
    shards (mixle_nb/cluster/elastic.py): the shards this rank read (a streaming handle: the
    ``[lo, hi)`` of the token file it now trains on)."""
    return lookup(handle).rejoin()


def data_sample_on_rank(handle: str, n: int) -> np.ndarray | None:
    """Up to ``n`` raw observations from this rank's encoded shard, for drawing; ``None`` if
    the encoding does not keep them. A shard of sequences (an HMM's) gives its first sequence,
    up to ``n`` time steps, each observation as its encoding keeps it ((T, D), or (T,))."""
    from ..stats.hmm import SequenceEncoding

    data = lookup(handle)
    chunks = [data] if isinstance(data, SequenceEncoding) else getattr(data, "chunks", None) or []
    if chunks and isinstance(chunks[0], SequenceEncoding):
        batch, rows = chunks[0].first_sequence()
        kept = _observations(batch.emissions)
        return None if kept is None else kept[rows[:n]]
    xs: list[np.ndarray] = [x for x in (_observations(c) for c in chunks) if x is not None]
    if not xs:
        return None
    x = np.concatenate(xs)
    x = x[np.linspace(0, len(x) - 1, min(n, len(x))).astype(int)] if len(x) else x
    return x[:, 0] if x.ndim == 2 and x.shape[1] == 1 else x


def _observations(chunk: Any) -> np.ndarray | None:
    """An encoded chunk's observations (N, D) or (N,), where the encoding keeps them: the
    Gaussians' points (D, N), or an ``x`` (mixle's encodings, Poisson counts)."""
    if hasattr(chunk, "parts"):  # columns of one family each (a multi-feature Poisson HMM's)
        columns = [_observations(part) for part in chunk.parts]
        kept = [c for c in columns if c is not None]
        return np.column_stack(kept) if len(kept) == len(columns) else None
    if hasattr(chunk, "labels") and hasattr(chunk, "index"):  # categorical: each one's label
        return np.asarray(chunk.labels)[chunk.index.cpu().numpy()]
    if hasattr(chunk, "points"):
        return chunk.points.T.cpu().numpy()
    if hasattr(chunk, "x"):
        return chunk.x.cpu().numpy() if hasattr(chunk.x, "cpu") else np.asarray(chunk.x)
    return None


def train_on_rank(
    handle: str, estimator: str, model: str, steps: int | None, every: int, stop: str | None = None
) -> dict:
    """Train up to ``steps`` more optimizer steps (``None``: to the end of the handle's epochs),
    publishing ``{step, loss, targets, targets_per_s, rank}`` every ``every`` steps (:func:`publish`:
    no collective). ``stop`` names a flag on the rank (``is_set()``) the training loop polls
    before each step: a panel in this process passes its Stop button's, which an engine's
    client cannot reach mid-call. The trained leaf is bound to ``model`` on the rank. The result
    repeats the call's last report: published data can reach the client after the result does."""
    h = lookup(handle)
    saved = h.max_steps, h.progress, h.progress_every, h.stop
    # the last chunk stops at the end of the handle's epochs instead of running past it
    left = h.total_steps - h.steps_done
    h.max_steps = max(0, left if steps is None else min(steps, left))
    last_report: dict = {}

    def report(progress: dict) -> None:
        last_report.update(progress)
        publish(progress)

    h.progress, h.progress_every = report, every
    if stop is not None:
        h.stop = lookup(stop)
    try:
        leaf = rank_namespace()[model] = h.pysp_seq_estimate(lookup(estimator), None)
    finally:
        h.max_steps, h.progress, h.progress_every, h.stop = saved
    return {
        "steps_done": h.steps_done,
        "total_steps": h.total_steps,
        "state": cpu_state(leaf.module) if h.rank == 0 else None,  # every rank holds the same weights
        "last_report": last_report or None,
    }


def cpu_state(module: torch.nn.Module) -> dict:
    """A copy of ``module.state_dict()`` as CPU tensors, which later training does not change."""
    return {k: v.detach().cpu().clone() for k, v in module.state_dict().items()}


def load_module_state_on_rank(estimator: str, state: dict) -> None:
    """Load ``state`` (a ``state_dict``) into the named estimator's module, so training
    continues from those weights."""
    lookup(estimator).module.load_state_dict(state)


def checkpoint_step_on_rank(handle: str) -> int | None:
    """The step of the handle's newest complete training checkpoint (None: none, or no
    checkpoints configured)."""
    checkpoints = getattr(lookup(handle), "checkpoints", None)
    found = checkpoints.latest() if checkpoints is not None else None
    return None if found is None else found[0]


def training_progress_on_rank(handle: str) -> dict:
    h = lookup(handle)
    return {"steps_done": h.steps_done, "total_steps": h.total_steps}


def generate_on_rank(model: str, prompt_ids: ArrayLike, n: int, temperature: float, seed: int) -> np.ndarray:
    return lookup(model).generate(prompt_ids, n, temperature=temperature, seed=seed)


def held_out_loss_on_rank(handle: str, model: str) -> float:
    """Mean next-token loss (nats) of the trained leaf ``model`` on the held-out token handle
    ``handle``, over every rank's shard (the handle all-reduces its count and total)."""
    count, total = lookup(handle).pysp_seq_log_density_sum(lookup(model))
    return -total / count


def initial_model_on_rank(handle: str, estimator: str, model: str, init: str, seed: int) -> Distribution:
    """The start ``init`` (``"kmeans++"``, ``"random_from_data"``, ``"random"``) finds on the
    handle, every rank taking part; bound to ``model`` here and returned."""
    from ..inference import initial_model

    start = initial_model(lookup(handle), lookup(estimator), init, rng=seed)
    rank_namespace()[model] = start
    return start


def choose_k_on_rank(handle: str, estimator: str, k_values: list, init: str, seed: int) -> dict:
    """Fit mixtures of K copies of the named mixture estimator's first component for each K
    (for an HMM: K states emitting from copies of its first state's family), scored by BIC
    and AIC on the handle: ``{k, bic, aic, models, best_k}`` (the same on every
    rank; ``best_k`` is :attr:`~mixle_nb.inference.KChoice.best_k`)."""
    from ..inference import choose_k
    from ..stats.hmm import HiddenMarkovEstimator, states_of_copies
    from ..stats.mixture import is_mixture_estimator, mixture_of_copies

    est = lookup(estimator)
    options: dict[str, Any] = {"init": init}
    if isinstance(est, HiddenMarkovEstimator):  # K states, each a copy of the first state's emission
        estimator_for: Callable[[int], Any] = functools.partial(states_of_copies, est)
        options["init_p"] = 1.0  # a random start draws posteriors for every sequence
    elif is_mixture_estimator(est):
        estimator_for = functools.partial(mixture_of_copies, est)
    else:
        raise TypeError(
            f"choosing K needs a MixtureEstimator (ours or mixle's); {estimator!r} is a {type(est).__name__} "
            "(a HiddenMarkovEstimator also works: K is then its number of states)"
        )
    found = choose_k(lookup(handle), estimator_for, k_values, rng=seed, out=None, **options)
    models = [r.model for r in found.results]
    return {"k": found.k, "bic": found.bic, "aic": found.aic, "models": models, "best_k": found.best_k}
