"""The encoded-data handle protocol shared by every distributed backend.

Names: the ``seq_*`` functions (``seq_encode``, ``seq_estimate``, ``seq_initialize``,
``seq_log_density_sum``) are the dispatch the user calls; they act on a *sequence* of
observations at once, encoded once. A ``pysp_*`` method is what a handle offers that dispatch
(the prefix comes from pysparkplug, mixle's ancestor, whose handles first carried it). Dispatch
recognises a handle by its ``pysp_*`` method, never by its type, so the optional methods below
are simply absent from a handle that lacks them: ``hasattr`` tells the truth.
"""

from __future__ import annotations

from typing import Any, Protocol, TypeVar, runtime_checkable

_Handle = TypeVar("_Handle", bound="HandleLifetime")


@runtime_checkable
class EncodedDataHandle(Protocol):
    """Resident encoded data (on ranks, workers or a device) answering estimation requests.

    Required: the four reference methods below, ``close()``, the context manager and
    ``__len__`` (the global observation count). Optional extensions, looked up with
    ``hasattr`` by dispatch and so not declared here:

    - ``pysp_em_step(estimator, prev_estimate) -> EMStep``: the new model and the previous
      model's log-density from one pass (dispatch tries it first).
    - ``pysp_kmeans_init(estimator, rng, init) -> model``: a k-means‖ (or random-observation)
      mixture start computed where the shards live; without it ``init="kmeans++"`` falls back
      to ``"random"`` with a warning.
    - ``pysp_shard_map(function, gather=False) -> ndarray``: ``function(enc)`` per shard
      (``predict``, ``predict_proba``, ``score_samples``); ``gather=True`` returns every
      observation's result in the original order on every rank.

    A ``typing.Protocol`` checked at run time: ``isinstance`` tells whether an object has the
    required methods. It is never instantiated.

    See Also
    --------
    TorchRunEncodedData, StreamingTokenEncodedData : The handles of this package.
    mixle_nb.stats.seq_estimate : The dispatch that drives a handle.

    Examples
    --------
    >>> import numpy as np
    >>> from mixle_nb.parallel import EncodedDataHandle, TorchRunEncodedData
    >>> from mixle_nb.stats import GaussianEstimator
    >>> x = np.arange(5.0)
    >>> with TorchRunEncodedData(x, GaussianEstimator(), init_process_group=False) as h:
    ...     isinstance(h, EncodedDataHandle), len(h)
    (True, 5)
    >>> isinstance(x, EncodedDataHandle)
    False
    """

    def pysp_seq_estimate(self, estimator: Any, prev_estimate: Any) -> Any:
        """One estimation step against the resident data.

        Parameters
        ----------
        estimator : Estimator
            The estimator of the model, the same on every rank.
        prev_estimate : Distribution or None
            The model the E-step runs under.

        Returns
        -------
        Distribution
            The new model.
        """

    def pysp_seq_initialize(self, estimator: Any, rng: Any, p: float) -> Any:
        """A randomised initial model from the resident data.

        Parameters
        ----------
        estimator : Estimator
            The estimator of the model.
        rng : numpy.random.RandomState
            The random source, seeded alike on every rank.
        p : float
            The share of observations each draws on.

        Returns
        -------
        Distribution
            The initial model.
        """

    def pysp_seq_log_density_sum(self, model: Any) -> tuple[float, float]:
        """The count and total log-density of the resident data under ``model``.

        Parameters
        ----------
        model : Distribution
            The model to score.

        Returns
        -------
        tuple of float
            ``(count, total log-density)``, over every rank.
        """

    def pysp_stream_accumulate(self, estimator: Any, model: Any) -> tuple[float, Any]:
        """The folded, key-tied statistics for streaming EM, without an M-step.

        mixle's drivers rebuild the accumulator from them with ``from_value``.

        Parameters
        ----------
        estimator : Estimator
            The estimator whose accumulators gather the statistics.
        model : Distribution
            The model the E-step runs under.

        Returns
        -------
        tuple
            ``(count, value)``: the global count and the accumulator's value.
        """

    def close(self) -> None:
        """Release what this handle owns."""

    def __enter__(self) -> Any: ...

    def __exit__(self, *exc_info: Any) -> None: ...

    def __len__(self) -> int: ...


class HandleLifetime:
    """Mixin giving a handle its context manager: ``with handle: ...`` closes it on exit."""

    def close(self) -> None:
        """Release what this handle owns."""
        raise NotImplementedError

    def __enter__(self: _Handle) -> _Handle:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
