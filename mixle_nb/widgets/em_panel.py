"""EMPanel: step EM interactively on a handle living on the ranks (or locally), plotting the
log-density per step (all-reduced across ranks), the model against the data and per-rank E-step times."""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any

import ipywidgets as w
import numpy as np

from ..stats.estimation import em_step
from ..cluster import rank_side
from .panel import Panel, plot_image, resolve_cluster
from .render import em_figure

REDRAW_INTERVAL_S = 0.2  # at most ~5 redraws per second during runs
PANEL_MODEL_NAME = "_mixle_panel_model"


@dataclass
class StepRecord:
    """One EM step: the model it produced, the all-reduced log-density of the model it started
    from (one E-step pass yields both), and each rank's E-step seconds."""

    step: int
    model: Any
    log_density: float
    rank_seconds: list


class EMPanel(Panel):
    """Interactive EM. With a cluster, ``handle``/``estimator``/``model`` are the names those
    objects have on the ranks: ``model`` names the current model there, and each step replaces
    it (a model object is pushed under a private name instead). Without a cluster (none given
    and none running) they are local objects.

    Buttons and their programmatic twins: Step ``step()``, Run N ``run(n)``, Pause ``pause()``,
    Back ``back(k)``, Reset ``reset()``. ``history`` keeps every step; a failed step leaves it
    and the current model untouched.
    """

    def __init__(self, cluster=None, *, handle, estimator, model, data_sample=None):
        super().__init__()
        self.cluster = resolve_cluster(cluster, handle, estimator)
        self.handle, self.estimator = handle, estimator
        if self.cluster is not None:
            if isinstance(model, str):
                self.model_name, self.start_model = model, self.cluster.pull(model)
            else:
                self.model_name, self.start_model = PANEL_MODEL_NAME, model
                self.cluster.push(**{PANEL_MODEL_NAME: model})
            if data_sample is None:
                data_sample = self.cluster.run(rank_side.data_sample_on_rank, handle, 2000, targets=[0])[0]
        else:
            self.model_name, self.start_model = None, model
        self.data_sample = None if data_sample is None else np.asarray(data_sample)
        self.history: list[StepRecord] = []
        self._lock = threading.Lock()
        self._pause = threading.Event()
        self._last_draw = 0.0
        self._build()
        self.redraw()

    # -- state -------------------------------------------------------------------------------

    @property
    def model(self):
        """The current model: the last step's, or the start."""
        return self.history[-1].model if self.history else self.start_model

    # -- the programmatic twins of the buttons ----------------------------------------------

    def step(self) -> StepRecord:
        """One EM step on every rank; blocks until it is recorded."""
        with self._lock:
            record = self._step_once()
        self.redraw()
        return record

    def run(self, n: int, block: bool = True) -> None:
        """``n`` steps; ``block=False`` returns at once (the Run button) and ``pause()`` stops
        the run before its next step."""
        if int(n) != n or n < 1:
            raise ValueError(f"run(n) needs a positive number of steps; got {n!r}")
        if self.running:
            raise RuntimeError("a run is already going: pause() it or wait() for it first")
        self._pause.clear()
        self._start_worker(self._run_loop, int(n))
        if block:
            self.wait()

    def pause(self) -> None:
        """Stop a run before its next step."""
        self._pause.set()

    def back(self, k: int = 1) -> None:
        """Rewind ``k`` steps (dropping them from ``history``) and push that model to the ranks."""
        if int(k) != k or not 0 < k <= len(self.history):
            raise ValueError(f"can go back 1..{len(self.history)} steps; got {k!r}")
        with self._lock:
            del self.history[len(self.history) - int(k):]
            self._push_current()
        self.redraw()

    def reset(self) -> None:
        """Forget every step and push the start model to the ranks."""
        with self._lock:
            self.history.clear()
            self._push_current()
        self.redraw()

    # -- work --------------------------------------------------------------------------------

    def _step_once(self) -> StepRecord:
        try:
            if self.cluster is not None:
                results = self.cluster.run(rank_side.em_step_on_rank, self.handle, self.estimator, self.model_name)
                model, log_density = results[0]["model"], results[0]["log_density"]
                seconds = [r["e_step_s"] for r in results]
            else:
                t0 = time.perf_counter()
                result = em_step(self.handle, self.estimator, self.model)
                model, log_density, seconds = result.model, result.log_density, [time.perf_counter() - t0]
        except BaseException as exc:
            self.error = exc
            self._show_status(f"step {len(self.history) + 1} failed: {type(exc).__name__}: {exc}", error=True)
            self._restore_ranks()
            raise
        record = StepRecord(len(self.history) + 1, model, float(log_density), seconds)
        self.history.append(record)
        self.error = None
        return record

    def _run_loop(self, n: int) -> None:
        self.progress.max, self.progress.value = n, 0
        for i in range(n):
            if self._pause.is_set():
                break
            try:
                with self._lock:
                    self._step_once()
            except BaseException:
                break  # _step_once has shown the error and kept the last good model
            self.progress.value = i + 1
            if time.monotonic() - self._last_draw >= REDRAW_INTERVAL_S:
                self.redraw()
        self.redraw()

    def _push_current(self) -> None:
        if self.cluster is not None:
            self.cluster.push(**{self.model_name: self.model})

    def _restore_ranks(self) -> None:
        """After a failed step, put the last good model back on every rank that can take it."""
        try:
            self._push_current()
        except Exception:  # a dead rank: the error already shown says to restart()
            pass

    # -- view --------------------------------------------------------------------------------

    def _build(self) -> None:
        self.buttons = {name: w.Button(description=name) for name in ("Step", "Run N", "Pause", "Back", "Reset")}
        self.n_steps = w.BoundedIntText(value=10, min=1, max=100_000, description="N",
                                        style={"description_width": "initial"}, layout=w.Layout(width="110px"))
        self.progress = w.IntProgress(value=0, min=0, max=1, description="run")
        self.status = w.HTML()
        self.image = plot_image()
        actions = {
            "Step": lambda: self._in_background(self.step),
            "Run N": lambda: self.run(self.n_steps.value, block=False),
            "Pause": self.pause,
            "Back": lambda: self.back(1) if self.history else None,
            "Reset": self.reset,
        }
        for name, button in self.buttons.items():
            button.on_click(lambda _, act=actions[name]: self._guarded(act))
        controls = w.HBox([self.buttons["Step"], self.n_steps, self.buttons["Run N"], self.buttons["Pause"],
                           self.buttons["Back"], self.buttons["Reset"]])
        self.widget = w.VBox([controls, w.HBox([self.progress, self.status]), self.image])
        self.widget.add_class("mixle-em-panel")

    def _in_background(self, action) -> None:
        if not self.running:
            self._start_worker(self._guarded, action)

    def _guarded(self, action) -> None:
        try:
            action()
        except BaseException as exc:  # a click must never raise into the kernel's comm handler
            self._show_status(f"{type(exc).__name__}: {exc}", error=True)

    def redraw(self) -> None:
        """Render the figure once and show the step counter."""
        history = list(self.history)
        seconds = history[-1].rank_seconds if history else []
        self.image.value = em_figure([r.log_density for r in history], self.model, self.data_sample, seconds,
                                     distributed=self.cluster is not None)
        if self.error is None:
            last = f" · log-density {history[-1].log_density:.6g}" if history else ""
            self._show_status(f"step {len(history)}{last}")
        self._last_draw = time.monotonic()
