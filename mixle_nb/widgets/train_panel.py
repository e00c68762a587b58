"""TrainPanel: streaming training across the ranks with a live loss curve per rank and their
mean, drawn from what the ranks publish (no extra collective), then text sampled from a prompt."""
from __future__ import annotations

import threading
import time

import ipywidgets as w

from ..cluster import rank_side
from .panel import Panel, plot_image, resolve_cluster
from .render import loss_figure, mean_curve

POLL_S = 0.2  # also the redraw throttle: at most 5 redraws per second
PANEL_LEAF_NAME = "_mixle_panel_leaf"


class TrainPanel(Panel):
    """Train / Stop a ``StreamingTokenEncodedData`` handle.

    With a cluster, ``handle`` and ``estimator`` are names on the ranks; training runs in
    calls of ``chunk_steps`` optimizer steps, so Stop takes effect within one chunk on any
    launcher (a busy engine cannot read a message from the client). Without a cluster they are
    local objects and Stop takes effect after the current step. ``tokenizer`` (a
    ``CharTokenizer``) decodes the sample generated from ``prompt`` after training.
    ``curves`` maps rank -> [(step, loss)]; ``train()`` and ``stop()`` are the buttons' twins.
    """

    def __init__(self, cluster=None, *, handle, estimator, tokenizer=None, prompt: str = "",
                 sample_chars: int = 200, chunk_steps: int = 20, report_every: int = 5,
                 temperature: float = 0.8):
        super().__init__()
        self.cluster = resolve_cluster(cluster, handle, estimator)
        if chunk_steps < 1 or report_every < 1:
            raise ValueError("chunk_steps and report_every must be positive")
        self.handle, self.estimator, self.tokenizer, self.prompt = handle, estimator, tokenizer, prompt
        self.sample_chars, self.chunk_steps, self.report_every = sample_chars, chunk_steps, report_every
        self.temperature = temperature
        self.curves: dict[int, list] = {}
        self.updates = 0  # progress reports received, all ranks together
        self.sample_text = ""
        self._stop = threading.Event()
        self._leaf = None
        self._started = 0.0
        self._build()
        self._redraw()

    def train(self, block: bool = True) -> None:
        """Train to the end of the handle's epochs (or until ``stop()``); ``block=False``
        returns at once, as the Train button does."""
        if self.running:
            raise RuntimeError("training is already running: stop() it or wait() for it first")
        self._stop.clear()
        self._start_worker(self._guarded_train)
        if block:
            self.wait()

    def stop(self) -> None:
        """Stop after the current step (locally) or chunk (on a cluster)."""
        self._stop.set()

    # -- work --------------------------------------------------------------------------------

    def _guarded_train(self) -> None:
        self.error = None
        self._started = time.monotonic()
        try:
            if self.cluster is not None:
                self._train_on_cluster()
            else:
                self._train_locally()
            self._show_sample()
        except BaseException as exc:
            self.error = exc
            self._show_status(f"{type(exc).__name__}: {exc}", error=True)
        self._redraw()

    def _train_on_cluster(self) -> None:
        done = self.cluster.run(rank_side.training_progress_on_rank, self.handle, targets=[0])[0]
        self.progress.max = done["total_steps"]
        steps_done, total = done["steps_done"], done["total_steps"]
        while steps_done < total and not self._stop.is_set():
            call = self.cluster.run_async(rank_side.train_on_rank, self.handle, self.estimator,
                                          PANEL_LEAF_NAME, self.chunk_steps, self.report_every)
            while not call.done():
                self._record(call.data)
                time.sleep(POLL_S)
            steps_done = call.result()[0]["steps_done"]
            self._record(call.data)
        self._leaf = PANEL_LEAF_NAME

    def _train_locally(self) -> None:
        h = self.handle
        saved = h.progress, h.progress_every, h.stop
        h.progress = lambda report: self._record({report.get("rank", 0): report})
        h.progress_every, h.stop = self.report_every, self._stop
        self.progress.max = h.total_steps
        try:
            self._leaf = h.pysp_seq_estimate(self.estimator, None)
        finally:
            h.progress, h.progress_every, h.stop = saved

    def _record(self, reports: dict) -> None:
        """Append new ``(step, loss)`` points per rank; redraw at most every POLL_S seconds."""
        for rank, report in reports.items():
            points = self.curves.setdefault(rank, [])
            if not points or report["step"] > points[-1][0]:
                points.append((report["step"], report["loss"]))
                self.updates += 1
                self._rates[rank] = report.get("tokens_per_s", 0.0)
        if time.monotonic() - self._last_draw >= POLL_S:
            self._redraw()

    def _show_sample(self) -> None:
        if self.tokenizer is None or not self.prompt:
            return
        ids = self.tokenizer.encode(self.prompt)
        if self.cluster is not None:
            out = self.cluster.run(rank_side.generate_on_rank, self._leaf, ids, self.sample_chars,
                                   self.temperature, 0, targets=[0])[0]
        else:
            out = self._leaf.generate(ids, self.sample_chars, temperature=self.temperature, seed=0)
        self.sample_text = self.tokenizer.decode(out)  # the prompt followed by the sample
        self.sample.value = self.sample_text

    # -- view --------------------------------------------------------------------------------

    def _build(self) -> None:
        self._rates: dict[int, float] = {}
        self._last_draw = 0.0
        self.train_button = w.Button(description="Train")
        self.stop_button = w.Button(description="Stop")
        self.train_button.on_click(lambda _: self.train(block=False) if not self.running else None)
        self.stop_button.on_click(lambda _: self.stop())
        self.progress = w.IntProgress(value=0, min=0, max=1, description="steps")
        self.status = w.HTML()
        self.image = plot_image()
        self.sample = w.Textarea(value="", placeholder="generated text appears here after training",
                                 layout=w.Layout(width="95%", height="90px"))
        self.widget = w.VBox([w.HBox([self.train_button, self.stop_button, self.progress, self.status]),
                              self.image, self.sample])
        self.widget.add_class("mixle-train-panel")

    def _redraw(self) -> None:
        self.image.value = loss_figure(self.curves)
        mean = mean_curve(self.curves)
        step = max((pts[-1][0] for pts in self.curves.values() if pts), default=0)
        self.progress.value = min(step, self.progress.max)
        if self.error is None and step:
            rate = sum(self._rates.values())
            elapsed = time.monotonic() - self._started
            left = elapsed / step * max(self.progress.max - step, 0) if self.running else 0.0
            loss = f" · mean loss {mean[-1][1]:.3f}" if mean else ""
            self._show_status(f"step {step}/{self.progress.max}{loss} · {rate:,.0f} tokens/s · {left:.0f} s left")
        self._last_draw = time.monotonic()
