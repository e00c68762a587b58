"""Finite mixtures over any component family; EM is the mixture passing responsibilities
to its components as observation weights."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, Protocol, TypeGuard

import numpy as np
import torch
from numpy.typing import ArrayLike

from . import foreign
from .base import Accumulator, Distribution, Encoder, Estimator, device_tensor, encoding_device, merge_into, resident
from .centred_moments import DegenerateComponentError
from .frame import FLOAT64_EXP_FLOOR, CentredBlock, SharedFrameBlock, encoding_dtype, in_dtype
from .sampler import Sampler

if TYPE_CHECKING:
    from .parameters import ParameterCount

# Components x dimensions x rows per E-step block on the CPU (4 MB of (K, D, rows) Gaussian
# differences, or of a shared frame's features and (K, rows) log-joint): the E-step reads the
# encoded data once, and the block's temporaries stay near the cores instead of streaming
# (K, N) arrays through memory.
BLOCK_ELEMENTS = 1 << 19
# Components x rows per block and thread of an encoding that stores its features (the full
# Gaussians'): the block makes none, it reads them twice (log-joint, then sums), the second
# time from near the core: 8192 rows a thread at K = 8 (2.9 MB of features at D = 8), measured
# (D = 8) on one thread at N = 1e6 0.83x the time of 16384 rows and 0.94x that of 4096, and on
# two threads at N = 2e5 (16384 rows) faster than 8192 and 32768.
STORED_BLOCK_ELEMENTS = 1 << 16
# On a GPU a block costs kernel launches and a copy of its statistics to the host, and the
# device's memory bandwidth does not need the cache: blocks as large as memory comfortably
# allows (components x rows x the encoding's ``row_width`` floats: 512 MB at most).
DEVICE_BLOCK_ELEMENTS = 1 << 26
# A float32 E-step's terms exp(log p - peak) stop at exp(-60) = 8.8e-27 instead of underflowing:
# float32 makes and multiplies subnormals (below 1.2e-38) 10-80x slower than normal numbers on
# the CPU, and 8.8e-27 times a responsibility's scale (>= 1/K) stays normal; a weight of 8.8e-27
# instead of 0 is below the rounding of any sum it joins.
FLOAT32_EXP_FLOOR = -60.0


def block_rows(device: torch.device, width: int, cpu_elements: int = BLOCK_ELEMENTS) -> int:
    """Rows per block whose temporaries hold ``width`` float64s per row, on ``device``."""
    elements = cpu_elements if device.type == "cpu" else DEVICE_BLOCK_ELEMENTS
    return max(512, elements // max(width, 1))


def blocks(enc: Any, k: int) -> Iterator[tuple[int, int, Any]]:
    """``(start, stop, rows)`` blocks of an encoding (at least one, maybe empty); the whole
    encoding if it cannot be sliced. Slicing lets an encoding build per-block data once."""
    n = len(enc)
    if not hasattr(enc, "rows"):
        yield 0, n, enc
        return
    device = encoding_device(enc)
    # On the CPU K x ``dim`` D floats a row size the block (the Gaussians' (K, D, rows)
    # differences, or their shared frame's features; else the (K, rows) log-joint): 65536 rows
    # at 1e6 x 1-D, K = 8, measured (2 threads, shared frame) faster than half as many and no
    # slower than twice as many. Stored features: K floats a row (STORED_BLOCK_ELEMENTS).
    if device.type == "cpu" and getattr(enc, "features", None) is not None:
        step = block_rows(device, k, STORED_BLOCK_ELEMENTS * torch.get_num_threads())
    elif device.type == "cpu":
        step = block_rows(device, k * getattr(enc, "dim", 1), BLOCK_ELEMENTS)
    else:
        step = block_rows(device, k * getattr(enc, "row_width", 1))
    for start in range(0, max(n, 1), step):
        stop = min(start + step, n)
        yield start, stop, enc.rows(start, stop)


def _stacked_kernel(objects: Sequence[object], name: str) -> Callable[..., Any] | None:
    """The family's batched kernel when every object is of one class that provides it."""
    kinds = {type(o) for o in objects}
    return getattr(kinds.pop(), name, None) if len(kinds) == 1 else None


def posterior(
    log_joint: torch.Tensor, weights: np.ndarray | torch.Tensor | None, peak: torch.Tensor, total: torch.Tensor
) -> torch.Tensor:
    """Turn ``(K, N)`` log p(x, z=k) into weighted responsibilities, in place.

    Component-major, so the reductions over K are elementwise passes over contiguous rows.
    Writes each observation's largest term to ``peak`` and its sum of ``exp(term - peak)`` to
    ``total``; ``log_density(peak, total)`` is then log p(x), which is why one E-step pass
    also reports the objective. A float32 log-joint (a float32 E-step) is worked on in float32
    and its ``peak`` and ``total`` copied into the float64 ones, so the objective adds up in float64.
    """
    same = log_joint.dtype == peak.dtype
    top = peak if same else torch.empty(peak.shape, dtype=log_joint.dtype, device=peak.device)
    summed = total if same else torch.empty(total.shape, dtype=log_joint.dtype, device=total.device)
    torch.amax(log_joint, dim=0, out=top)
    top.clamp_(min=torch.finfo(top.dtype).min)  # an observation impossible under every component stays -inf
    resp = log_joint.sub_(top)
    if not same:  # float32: exp below its smallest normal number makes subnormals, 10-20x slower to make and use
        resp.clamp_(min=FLOAT32_EXP_FLOOR).exp_()
    elif resp.device.type == "cpu":
        exp_floored_(resp)
    else:
        resp.exp_()
    torch.sum(resp, dim=0, out=summed)  # >= 1 (the peak's own term) unless impossible
    if not same:
        peak.copy_(top)
        total.copy_(summed)
    scale = summed.clamp(min=1.0).reciprocal_()
    if weights is not None:
        scale.mul_(device_tensor(weights, scale.device))
    return resp.mul_(scale)


def exp_floored_(values: torch.Tensor) -> torch.Tensor:
    """``values.exp_()`` for float64 ``values <= 0``, with the terms below ``FLOAT64_EXP_FLOOR``
    exactly 0 (in place)."""
    below = values < FLOAT64_EXP_FLOOR
    return values.clamp_(min=FLOAT64_EXP_FLOOR).exp_().masked_fill_(below, 0.0)


def block_posterior(log_joint: torch.Tensor, weights: torch.Tensor | None) -> tuple[torch.Tensor, float]:
    """A block's ``(K, B)`` log-joints turned into weighted responsibilities in place
    (:func:`posterior`), with the block's ``Σ w·log p(x)``."""
    rows = log_joint.shape[1]
    peak = torch.empty(rows, dtype=log_joint.dtype, device=log_joint.device)
    total = torch.empty(rows, dtype=log_joint.dtype, device=log_joint.device)
    resp = posterior(log_joint, weights, peak, total)
    density = log_density(peak, total)
    return resp, float(density.sum() if weights is None else density @ weights)


def log_density(peak: torch.Tensor, total: torch.Tensor) -> torch.Tensor:
    return total.log().add_(peak)


def component_log_density(component: Distribution, enc: Any) -> torch.Tensor:
    """A component's ``(N,)`` log-densities on the encoding's device; a component of another
    package (mixle's, whose encodings are on the CPU) through its ``seq_log_density``."""
    if hasattr(component, "device_log_density"):
        return component.device_log_density(enc)
    return torch.from_numpy(np.asarray(component.seq_log_density(enc), np.float64))


class MixtureDistribution(Distribution):
    """A mixture: ``components`` (any family, one shared encoding) with weights ``w``.

    Parameters
    ----------
    components : sequence of Distribution
        The components, all encoding data alike.
    w : array_like
        Their weights, ``>= 0`` and summing to 1.

    Raises
    ------
    ValueError
        Weights that are negative, not finite, or do not sum to 1, or whose number differs from
        the components'.

    See Also
    --------
    MixtureEstimator, mixle_nb.inference.predict_proba

    Examples
    --------
    >>> import numpy as np
    >>> from mixle_nb.stats import GaussianDistribution, MixtureDistribution
    >>> model = MixtureDistribution([GaussianDistribution(-2.0, 1.0), GaussianDistribution(2.0, 1.0)], [0.5, 0.5])
    >>> enc = model.dist_to_encoder().seq_encode(np.array([-2.0, 0.0]))
    >>> model.seq_posterior(enc).round(3)
    array([[1. , 0. ],
           [0.5, 0.5]])
    """

    def __init__(self, components: Sequence[Distribution], w: ArrayLike):
        self.components = list(components)
        if not self.components:
            raise ValueError("a mixture needs at least one component")
        self.w = np.asarray(w, dtype=np.float64).reshape(-1)
        if len(self.w) != len(self.components):
            raise ValueError(f"{len(self.components)} components but {len(self.w)} weights")
        if not np.isfinite(self.w).all() or (self.w < 0).any() or abs(self.w.sum() - 1.0) > 1e-8:
            raise ValueError(
                f"mixture weights must be finite, >= 0 and sum to 1; they sum to {self.w.sum()!r}. "
                "Normalise them with w / w.sum()"
            )
        with np.errstate(divide="ignore"):
            self._log_w = np.log(self.w)
        self._kernel: Callable[[Any], torch.Tensor] | None = None

    @classmethod
    def _estimated(cls, components: list[Distribution], w: np.ndarray) -> MixtureDistribution:
        """An M-step's mixture: ``w`` float64, >= 0 and normalised by construction, unchecked."""
        mixture = cls.__new__(cls)
        mixture.components, mixture.w = components, w
        with np.errstate(divide="ignore"):
            mixture._log_w = np.log(w)
        mixture._kernel = None
        return mixture

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_kernel": None}  # rebuilt on first use after unpickling

    def __repr__(self) -> str:
        return f"MixtureDistribution({self.components!r}, w={self.w.tolist()})"

    def log_joint(self, enc: Any) -> torch.Tensor:
        """The joint ``log w_k + log p_k(x)`` of every component and observation.

        One batched kernel when the family has one.

        Parameters
        ----------
        enc : encoding
            The encoded observations.

        Returns
        -------
        torch.Tensor
            ``(K, N)`` float64, on the encoding's device.
        """
        return self._batched()(enc)

    def log_joint_terms(self, enc: Any) -> tuple[torch.Tensor, CentredBlock | SharedFrameBlock | None]:
        """:meth:`log_joint` and what the kernel computed on the way for the M-step to reuse.

        Parameters
        ----------
        enc : encoding
            The encoded observations.

        Returns
        -------
        joint : torch.Tensor
            ``(K, N)`` log-joints.
        block : CentredBlock or SharedFrameBlock or None
            The Gaussians' centred differences, which their accumulators' sums reuse; ``None`` for
            other families.
        """
        kernel = self._batched()
        joint = getattr(kernel, "joint", None)
        return joint(enc) if joint is not None else (kernel(enc), None)

    def _batched(self) -> Callable[[Any], torch.Tensor]:
        if self._kernel is None:
            stacked = _stacked_kernel(self.components, "stacked_kernel")
            self._kernel = stacked(self.components, self._log_w) if stacked else self._per_component
        return self._kernel

    def _per_component(self, enc: Any) -> torch.Tensor:
        lp = torch.stack([component_log_density(c, enc) for c in self.components])
        return lp.add_(torch.from_numpy(self._log_w).to(lp.device)[:, None])

    def device_log_density(self, enc: Any) -> torch.Tensor:
        return torch.logsumexp(self.log_joint(enc), dim=0)

    def seq_posterior(self, enc: Any) -> np.ndarray:
        """The component responsibilities of each encoded observation.

        Parameters
        ----------
        enc : encoding
            The encoded observations.

        Returns
        -------
        numpy.ndarray
            ``(N, K)``, each row summing to 1.
        """
        peak, total = torch.empty(2, len(enc), dtype=torch.float64, device=encoding_device(enc))
        return posterior(self.log_joint(enc), None, peak, total).T.cpu().numpy()

    def dist_to_encoder(self) -> Encoder:
        return self.components[0].dist_to_encoder()

    def estimator(self, **kwargs: Any) -> MixtureEstimator:
        return MixtureEstimator([foreign.estimator(c) for c in self.components], **kwargs)

    def draw(self, rng: np.random.Generator, n: int) -> np.ndarray:
        z = rng.choice(len(self.w), size=n, p=self.w)
        counts = np.bincount(z, minlength=len(self.w))
        drawn = np.concatenate([foreign.draw(c, rng, int(m)) for c, m in zip(self.components, counts)])
        out = np.empty_like(drawn)
        out[np.argsort(z, kind="stable")] = drawn
        return out

    def sampler(self, seed: int | np.random.SeedSequence | None = None) -> Sampler:
        """A sampler drawing from this mixture.

        Parameters
        ----------
        seed : int or numpy.random.SeedSequence, optional
            The seed of its random source.

        Returns
        -------
        Sampler
            ``sample(n)`` draws ``n`` observations; ``sample()`` one.
        """
        return Sampler(self.draw, seed)


class MixtureAccumulator(Accumulator):
    """Component counts plus one accumulator per component. ``keys`` ties the weights;
    ``dtype``, where given, is the E-step's (the components' encoder in that dtype)."""

    def __init__(self, accumulators: list, keys: str | None, dtype: torch.dtype | None = None):
        self.accumulators = accumulators
        self.counts = np.zeros(len(accumulators))
        self.keys = keys
        self.dtype = dtype

    def _update_components(
        self,
        enc: Any,
        resp: torch.Tensor,
        models: Sequence[Any] | None = None,
        initialize_rng: np.random.Generator | None = None,
        block: CentredBlock | SharedFrameBlock | None = None,
        references: np.ndarray | None = None,
    ) -> None:
        """Responsibilities ``(K, N)`` become component weights: an update under ``models``, or a
        random initialisation when ``initialize_rng`` is given. Our accumulators take the rows
        where they are, with the E-step's ``block`` or the ``references`` to centre on (see
        :meth:`seq_update_responsibilities`), every initialisation numpy rows (another
        package's accumulator gets numpy rows through ``foreign.py``)."""
        stacked = _stacked_kernel(self.accumulators, "stacked_seq_update")
        if stacked is not None:
            if block is None and references is None and models is not None and all(hasattr(m, "mu") for m in models):
                references = np.stack([np.atleast_1d(np.asarray(m.mu, dtype=np.float64)) for m in models])
            self.counts += stacked(self.accumulators, enc, resp, block=block, references=references)
            return
        self.counts += resp.sum(dim=1, dtype=torch.float64).cpu().numpy()
        if initialize_rng is not None:
            for acc, weights in zip(self.accumulators, resp.cpu().numpy()):
                acc.seq_initialize(enc, weights, initialize_rng)
        elif models is not None:
            for acc, weights, model in zip(self.accumulators, resp, models):
                acc.seq_update(enc, weights, model)
        else:
            raise TypeError("_update_components needs the models to update under, or initialize_rng")

    def seq_update(
        self, enc: Any, weights: np.ndarray | torch.Tensor | None, model: MixtureDistribution
    ) -> np.ndarray | torch.Tensor:
        """The E-step; returns the per-observation log-density of ``model`` (see ``resident``).
        A family that can (the Gaussians) adds its M-step sums up on the device over the
        blocks and takes them once, after the last."""
        peak, total = torch.empty(2, len(enc), dtype=torch.float64, device=encoding_device(enc))
        gather = _stacked_kernel(self.accumulators, "stacked_block_sums")
        sums = gather(self.accumulators) if gather is not None else None
        for start, stop, block in blocks(enc, len(self.accumulators)):
            w = None if weights is None else weights[start:stop]
            log_joint, terms = model.log_joint_terms(block)
            resp = posterior(log_joint, w, peak[start:stop], total[start:stop])
            if sums is not None and terms is not None:
                sums.add(terms, resp)
            else:
                self._update_components(block, resp, models=model.components, block=terms)
        if sums is not None:
            self.counts += sums.hand_over()
        return resident(log_density(peak, total))

    def seq_update_responsibilities(self, enc: Any, resp: torch.Tensor, references: np.ndarray | None = None) -> None:
        """Add ``enc`` with given ``(K, N)`` responsibilities (hard labels, say) and no E-step.
        ``references`` (K, D): points near each component's data, the same on every rank (k-means
        centres), for the Gaussian families to centre their sums on; else they use their own
        (:meth:`set_reference`) or the origin."""
        self._update_components(enc, resp, models=[None] * len(self.accumulators), references=references)

    def set_reference(self, point: ArrayLike) -> None:
        """Have the components centre the sums to come at ``point`` where they can."""
        for acc in self.accumulators:
            if hasattr(acc, "set_reference"):
                acc.set_reference(point)

    def seq_initialize(self, enc: Any, weights: np.ndarray | torch.Tensor | None, rng: np.random.Generator) -> None:
        # A sparse Dirichlet makes each observation mostly one component's, so components start apart.
        k = len(self.accumulators)
        drawn = rng.dirichlet(np.full(k, 1.0 / (k * k)), size=len(enc))
        if weights is not None:
            drawn *= np.asarray(weights, dtype=np.float64)[:, None]
        resp = torch.from_numpy(np.ascontiguousarray(drawn.T)).to(encoding_device(enc))
        self._update_components(enc, resp, initialize_rng=rng)

    def value(self) -> tuple[np.ndarray, list[Any]]:
        return self.counts.copy(), [acc.value() for acc in self.accumulators]

    def from_value(self, value: tuple) -> MixtureAccumulator:
        self.counts = np.array(value[0], dtype=np.float64)
        for acc, v in zip(self.accumulators, value[1]):
            acc.from_value(v)
        return self

    def combine(self, value: tuple) -> MixtureAccumulator:
        self.counts += value[0]
        for acc, v in zip(self.accumulators, value[1]):
            acc.combine(v)
        return self

    def key_merge(self, stats: dict) -> None:
        if self.keys is not None:
            merge_into(stats, self.keys, self.counts)
        for acc in self.accumulators:
            acc.key_merge(stats)

    def key_replace(self, stats: dict) -> None:
        if self.keys is not None:
            self.counts = stats[self.keys].value()
        for acc in self.accumulators:
            acc.key_replace(stats)

    def acc_to_encoder(self) -> Encoder:
        encoder = self.accumulators[0].acc_to_encoder()
        return encoder if self.dtype is None else in_dtype(encoder, self.dtype)


class MixtureEstimator(Estimator):
    """M-step for a mixture: weights ∝ counts + ``pseudo_count``, components from their estimators.

    Parameters
    ----------
    estimators : sequence of Estimator
        One estimator per component (ours or mixle's).
    pseudo_count : float, default 0.0
        Added to every component's count before the weights are normalised.
    keys : str, optional
        Ties the weights with every mixture estimator of the same key.
    dtype : torch.dtype, numpy dtype or str, optional
        The E-step's arithmetic, float64 or float32, for components of our Gaussian families
        (their estimators' ``dtype``); default: the components' own (float64 unless they say).

    Raises
    ------
    ValueError
        No component estimator, or a ``dtype`` other than float32 or float64.

    See Also
    --------
    MixtureDistribution, mixle_nb.inference.fit

    Examples
    --------
    >>> import numpy as np
    >>> from mixle_nb.stats import GaussianEstimator, MixtureEstimator, seq_encode, seq_initialize, seq_estimate
    >>> rng = np.random.default_rng(0)
    >>> x = np.concatenate([rng.normal(-3, 1, 100), rng.normal(3, 1, 100)])
    >>> estimator = MixtureEstimator([GaussianEstimator()] * 2)
    >>> enc = seq_encode(x, estimator=estimator)
    >>> model = seq_initialize(enc, estimator, np.random.RandomState(0), 0.1)
    >>> for _ in range(50):
    ...     model = seq_estimate(enc, estimator, model)
    >>> sorted(round(c.mu) for c in model.components)
    [-3, 3]
    """

    def __init__(
        self, estimators: Sequence[Estimator], pseudo_count: float = 0.0, keys: str | None = None, dtype: Any = None
    ):
        self.estimators = list(estimators)
        if not self.estimators:
            raise ValueError("MixtureEstimator needs at least one component estimator")
        self.pseudo_count, self.keys = float(pseudo_count), keys
        self.dtype = None if dtype is None else encoding_dtype(dtype)

    def make_accumulator(self) -> MixtureAccumulator:
        return MixtureAccumulator([foreign.accumulator(e) for e in self.estimators], self.keys, self.dtype)

    def estimate(self, nobs: float | None, value: tuple) -> MixtureDistribution:
        counts, component_values = value
        stacked = _stacked_kernel(self.estimators, "stacked_estimate")
        components = stacked(self.estimators, component_values) if stacked is not None else None
        if components is None:
            components = self._each_estimated(counts, component_values)
        weights = np.asarray(counts, dtype=np.float64) + self.pseudo_count
        total = weights.sum()
        if not (np.isfinite(weights).all() and (weights >= 0).all()):
            return MixtureDistribution(components, weights)  # its error names the weights
        w = weights / total if total > 0 else np.full(len(weights), 1.0 / len(weights))
        return MixtureDistribution._estimated(components, w)

    def _each_estimated(self, counts: np.ndarray, component_values: Sequence[Any]) -> list[Distribution]:
        """Each component from its own estimator; a degenerate one's error names it."""
        components = []
        for k, (e, c, v) in enumerate(zip(self.estimators, counts, component_values)):
            try:
                components.append(e.estimate(c, v))
            except DegenerateComponentError as error:
                raise DegenerateComponentError(f"component {k} of {len(self.estimators)} {error}") from None
        return components

    def free_parameters(self, model: MixtureDistribution, count: ParameterCount) -> int:  # type: ignore[override]  # Estimator is not generic in its model: each family counts only its own
        """How many free parameters ``model`` has as this estimator fits it.

        The weights (unless ``keys`` ties them and they were counted already) and each component's
        own count.

        Parameters
        ----------
        model : MixtureDistribution
            A fitted mixture.
        count : ParameterCount
            The count in progress (which keys were counted already).

        Returns
        -------
        int
            ``K - 1`` weights plus the components' free parameters.
        """
        weights = 0 if count.tied("weights", self.keys) else len(model.components) - 1
        return weights + sum(count.of(e, c) for e, c in zip(self.estimators, model.components))


class MixtureEstimating(Protocol):
    """What the drivers use of a mixture's estimator, ours or mixle's: its components."""

    @property
    def estimators(self) -> Sequence[Any]: ...


def is_mixture_estimator(estimator: object) -> TypeGuard[MixtureEstimating]:
    """Whether ``estimator`` fits a mixture: ours or mixle's ``MixtureEstimator``.

    The one capability check for a mixture, used by every driver that needs one (the
    component-count check before EM, choosing K on the ranks). It asks for the type, not for
    an ``estimators`` attribute, because product (composite) estimators have one too.

    Parameters
    ----------
    estimator : object
        Any estimator.

    Returns
    -------
    bool
        True for an instance of :class:`MixtureEstimator` or of mixle's
        ``mixle.stats.MixtureEstimator`` (or a subclass of either).
    """
    mixle_mixture = foreign.mixle_class("MixtureEstimator")
    return isinstance(estimator, MixtureEstimator) or (
        mixle_mixture is not None and isinstance(estimator, mixle_mixture)
    )


def mixture_of_copies(estimator: object, k: int) -> Estimator:
    """A mixture estimator of ``k`` copies of ``estimator``'s first component, of the same
    class (ours stays ours, mixle's stays mixle's).

    Parameters
    ----------
    estimator : MixtureEstimator or mixle.stats.MixtureEstimator
        The mixture whose first component is copied.
    k : int
        The number of components.

    Returns
    -------
    MixtureEstimator or mixle.stats.MixtureEstimator
        ``type(estimator)([component] * k)``.

    Raises
    ------
    TypeError
        If ``estimator`` is not a mixture estimator (see :func:`is_mixture_estimator`).
    """
    mixture: object = estimator
    if not is_mixture_estimator(mixture):
        raise TypeError(
            f"a mixture of K components needs a MixtureEstimator (ours or mixle's); got {type(estimator).__name__}"
        )
    same_class: type = type(mixture)
    copies: Estimator = same_class([mixture.estimators[0]] * k)
    return copies
