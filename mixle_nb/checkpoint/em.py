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
    """The checkpoint file at ``path``, written every ``every`` steps (and at a run's end).

    Pass one, or a bare path (``every=1``), as ``fit(..., checkpoint=)`` or
    ``EMPanel(..., checkpoint=)``. If the file exists, the fit or the panel continues from it.
    """

    def __init__(self, path: str | os.PathLike, every: int = 1):
        self.path = os.fspath(path)
        self.every = validation.positive_int("every", every)

    def __repr__(self) -> str:
        return f"EMCheckpoint({self.path!r}, every={self.every})"

    @classmethod
    def of(cls, checkpoint: Any) -> EMCheckpoint | None:
        """``checkpoint`` as an EMCheckpoint: None, a path, or one already."""
        if checkpoint is None or isinstance(checkpoint, cls):
            return checkpoint
        if isinstance(checkpoint, (str, os.PathLike)):
            return cls(checkpoint)
        raise TypeError(f"checkpoint must be a path or an EMCheckpoint, got {type(checkpoint).__name__}")

    def due(self, step: int, before: int | None = None) -> bool:
        """Whether the steps after ``before`` (default ``step - 1``) up to ``step`` reach a
        multiple of ``every``."""
        return step // self.every > (step - 1 if before is None else before) // self.every

    def save(self, kind: str, state: dict) -> None:
        write_atomically(self.path, pickle.dumps({"format": FORMAT, "version": VERSION, "kind": kind, **state}))

    def load(self, kind: str) -> dict | None:
        """The saved state, or None when there is no file yet."""
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
        """The saved state of a fit with these ``n_init`` and ``init``, its generator state put
        back into ``rng``; None when there is none. ``start`` is the start to run next, ``run``
        that start's ``(model, previous log-density, history)`` if it had begun, ``best`` and
        ``finals`` what the finished starts found."""
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
        """Save a fit at ``start`` (``run``: that start's model, previous log-density, history)."""
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
