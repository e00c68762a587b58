"""EM checkpoints: an EM run's model and history in one file, replaced atomically every
``every`` steps, from which a new process continues the same run step for step.

EM is deterministic given its model, so the model a step produced, the log-density it
started from and the steps so far are the whole state of a run; ``fit``'s restarts add the
random generator's state (the next start's draw) and the finished starts' results.
"""

from __future__ import annotations

import os
import pickle
from typing import Any

import numpy as np

from .. import validation
from .atomic import write_atomically

FORMAT = "mixle_nb EM checkpoint"
VERSION = 2  # 2: every step an EMStep (1 held fit's IterationRecord or the panel's StepRecord)


class EMCheckpoint:
    """The checkpoint file of an EM run, written every ``every`` steps (and at a run's end).

    Pass one, or a bare path (``every=1``), as ``fit(..., checkpoint=)`` or
    ``EMPanel(..., checkpoint=)``. If the file exists, the fit or the panel continues from it, step
    for step the run it saved: EM is deterministic given its model, so the model a step produced,
    the log-density it started from and the steps so far are the whole state of a run (``fit``'s
    restarts add the random generator's state and the finished starts' results). The file is
    replaced atomically (:func:`write_atomically`).

    Parameters
    ----------
    path : str or os.PathLike
        The checkpoint file.
    every : int, default 1
        Steps between writes.

    Raises
    ------
    ValueError
        ``every`` is not a positive integer.

    See Also
    --------
    mixle_nb.inference.fit, mixle_nb.widgets.EMPanel

    Examples
    --------
    A second fit with the same file continues from it; the first one finished here, so the
    second returns its result without taking a step:

    >>> import os, tempfile
    >>> import numpy as np
    >>> from mixle_nb.checkpoint import EMCheckpoint
    >>> from mixle_nb.inference import fit
    >>> from mixle_nb.stats import GaussianEstimator, MixtureEstimator
    >>> rng = np.random.default_rng(0)
    >>> x = np.concatenate([rng.normal(-3, 1, 200), rng.normal(3, 1, 200)])
    >>> estimator = MixtureEstimator([GaussianEstimator()] * 2)
    >>> with tempfile.TemporaryDirectory() as folder:
    ...     saved = EMCheckpoint(os.path.join(folder, "fit.ckpt"), every=1)
    ...     first = fit(x, estimator, rng=0, max_its=3, tol=0, out=None, checkpoint=saved)
    ...     again = fit(x, estimator, rng=0, max_its=3, tol=0, out=None, checkpoint=saved)
    >>> again.n_iter, again.log_density == first.log_density
    (3, True)
    """

    def __init__(self, path: str | os.PathLike, every: int = 1):
        self.path = os.fspath(path)
        self.every = validation.positive_int("every", every)

    def __repr__(self) -> str:
        return f"EMCheckpoint({self.path!r}, every={self.every})"

    @classmethod
    def of(cls, checkpoint: Any) -> EMCheckpoint | None:
        """A checkpoint argument as an EMCheckpoint.

        Parameters
        ----------
        checkpoint : None, str, os.PathLike or EMCheckpoint
            What a ``checkpoint=`` argument was given.

        Returns
        -------
        EMCheckpoint or None
            ``None`` for ``None``, a path as ``EMCheckpoint(path)``, an EMCheckpoint as it is.

        Raises
        ------
        TypeError
            Anything else.

        Examples
        --------
        >>> from mixle_nb.checkpoint import EMCheckpoint
        >>> EMCheckpoint.of("run.ckpt")
        EMCheckpoint('run.ckpt', every=1)
        >>> EMCheckpoint.of(None) is None
        True
        """
        if checkpoint is None or isinstance(checkpoint, cls):
            return checkpoint
        if isinstance(checkpoint, (str, os.PathLike)):
            return cls(checkpoint)
        raise TypeError(f"checkpoint must be a path or an EMCheckpoint, got {type(checkpoint).__name__}")

    def due(self, step: int, before: int | None = None) -> bool:
        """Whether a write is due after the steps ``before + 1 .. step``.

        Parameters
        ----------
        step : int
            The last step taken.
        before : int, optional
            The last step of the previous write's check (default ``step - 1``).

        Returns
        -------
        bool
            Whether those steps reach a multiple of ``every``.

        Examples
        --------
        >>> from mixle_nb.checkpoint import EMCheckpoint
        >>> saved = EMCheckpoint("run.ckpt", every=5)
        >>> saved.due(4), saved.due(5), saved.due(7, before=3)
        (False, True, True)
        """
        return step // self.every > (step - 1 if before is None else before) // self.every

    def save(self, kind: str, state: dict) -> None:
        """Write a run's state, replacing the file atomically.

        Parameters
        ----------
        kind : {"fit", "panel"}
            Whose state it is.
        state : dict
            The state (pickled with the format's name and version).
        """
        write_atomically(self.path, pickle.dumps({"format": FORMAT, "version": VERSION, "kind": kind, **state}))

    def load(self, kind: str) -> dict | None:
        """The saved state of a run of ``kind``.

        Parameters
        ----------
        kind : {"fit", "panel"}
            Whose state is expected.

        Returns
        -------
        dict or None
            The state, or ``None`` when there is no file yet.

        Raises
        ------
        ValueError
            The file is not an EM checkpoint, is of another version, or holds the other kind's
            state.
        """
        try:
            with open(self.path, "rb") as f:
                state = pickle.load(f)
        except FileNotFoundError:
            return None
        except AttributeError as exc:  # a class of an older mixle_nb, gone since
            raise ValueError(
                f"{self.path} was written by an older mixle_nb ({exc}): its steps cannot be "
                "read; delete it or pass another path"
            ) from exc
        if not isinstance(state, dict) or state.get("format") != FORMAT:
            raise ValueError(f"{self.path} is not a mixle_nb EM checkpoint; pass another path")
        if state.get("version") != VERSION:
            raise ValueError(
                f"{self.path} is an EM checkpoint of version {state.get('version')}, and this "
                f"mixle_nb reads version {VERSION}: delete it or pass another path"
            )
        if state["kind"] != kind:
            names = {"panel": "an EMPanel", "fit": "a fit"}
            raise ValueError(
                f"{self.path} is the checkpoint of {names[state['kind']]}, not of {names[kind]}; pass another path"
            )
        return state

    # ---- fit()

    def resume_fit(self, n_init: int, init: str, rng: np.random.Generator) -> dict | None:
        """The saved state of a fit with these ``n_init`` and ``init``.

        Parameters
        ----------
        n_init : int
            The fit's number of starts.
        init : str
            The fit's start name.
        rng : numpy.random.Generator
            The fit's random source: the saved generator state is put back into it.

        Returns
        -------
        dict or None
            ``start`` (the start to run next), ``run`` (that start's ``(model, previous
            log-density, history)`` if it had begun), ``best`` and ``finals`` (what the finished
            starts found); ``None`` when there is no file yet.

        Raises
        ------
        ValueError
            The file holds a fit with another ``n_init`` or ``init``, or is not a fit's checkpoint.
        """
        state = self.load("fit")
        if state is None:
            return None
        if (state["n_init"], state["init"]) != (n_init, init):
            raise ValueError(
                f"{self.path} holds a fit with n_init={state['n_init']}, "
                f"init={state['init']!r}, not n_init={n_init}, init={init!r}: delete it, "
                "or pass another checkpoint path"
            )
        rng.bit_generator.state = state["rng"]
        return state

    def save_fit(
        self,
        n_init: int,
        init: str,
        rng: np.random.Generator,
        start: int,
        best: object,
        finals: list,
        run: tuple | None = None,
    ) -> None:
        """Save a fit at the start ``start``.

        Parameters
        ----------
        n_init : int
            The fit's number of starts.
        init : str
            The fit's start name.
        rng : numpy.random.Generator
            The fit's random source (its state is saved).
        start : int
            The start to run next (or the one in progress, with ``run``).
        best : FitResult or None
            The best finished start so far.
        finals : list of float
            The finished starts' final log-densities.
        run : tuple, optional
            The start in progress: its model, previous log-density and history.
        """
        self.save(
            "fit",
            {
                "n_init": n_init,
                "init": init,
                "rng": rng.bit_generator.state,
                "start": start,
                "best": best,
                "finals": list(finals),
                "run": run,
            },
        )
