"""The EM panel's figure, kept between redraws: log-density per step, its gain per step on a
log scale (how fast EM converges), the model against the data, and each rank's E-step time."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import NullLocator

from .axis_limits import LOG_MIN_DECADES, fit_limits, fit_steps
from .hmm_picture import HMMPicture, is_hmm
from .live_figure import DPI, LiveFigure, static_png
from .model_picture import ModelPicture

FIGSIZE = (13.0, 3.1)
SLOW_STEP = 3.0  # an earlier step's time over this many times the median is not fitted by the bars' axis
HMM_FIGSIZE = (13.0, 6.4)  # a second row: transitions, emissions, a sequence by its states


def gains(log_densities: Sequence[float]) -> np.ndarray:
    """Gain of each step over the previous one (step 2 on); steps that did not gain are NaN
    (a log scale cannot show them, and EM only loses by rounding)."""
    g = np.diff(np.asarray(log_densities, dtype=float))
    return np.where(g > 0, g, np.nan)


class EMView:
    """Draw with :meth:`render`; a new model of the same shape only updates artists. A hidden
    Markov model gets a second row (:class:`~.hmm_picture.HMMPicture`), ``data`` then being
    one of its sequences."""

    def __init__(
        self, model: Any, data: np.ndarray | None, distributed: bool, picture_dims: Sequence[int] | None = None
    ) -> None:
        hmm = is_hmm(model)
        self.live = live = LiveFigure(HMM_FIGSIZE if hmm else FIGSIZE)
        fig = live.figure
        self.picture: ModelPicture | HMMPicture
        if hmm:
            (self.objective, self.convergence, self.ranks), picture_axes = fig.subplots(2, 3)
            fig.subplots_adjust(left=0.06, right=0.99, bottom=0.09, top=0.94, wspace=0.25, hspace=0.42)
            self.picture = HMMPicture(live, picture_axes, model, data)
        else:
            self.objective, self.convergence, picture_ax, self.ranks = fig.subplots(1, 4)
            fig.subplots_adjust(left=0.06, right=0.99, bottom=0.17, top=0.88, wspace=0.32)
            self.picture = ModelPicture(live, picture_ax, model, data, picture_dims)
        self.objective.set_title(f"{'all-reduced ' if distributed else ''}log-density per EM step", fontsize=10)
        self.objective.set_xlabel("EM step", fontsize=9, labelpad=1)
        self.objective_line = live.dynamic(self.objective.plot([], [], "o-", color="#2c3e50", ms=3)[0])
        self.convergence.set_title("gain per step (log scale)", fontsize=10)
        self.convergence.set_xlabel("EM step", fontsize=9, labelpad=1)
        self.convergence.set_yscale("log")
        self.convergence.yaxis.set_minor_locator(NullLocator())  # minor log ticks cost a third of a full draw
        self.convergence.set_ylim(1e-3, 1e3)  # until there is a gain to fit
        self.gain_line = live.dynamic(self.convergence.plot([], [], "o-", color="#8e44ad", ms=3)[0])
        self.ranks.set_title(f"E-step ms {'per rank' if distributed else '(this process)'}, last step", fontsize=10)
        self.ranks.set_xlabel("rank", fontsize=9, labelpad=1)
        self.bars: list = []
        for ax in (self.objective, self.convergence):
            fit_steps(ax, 0)
        self.model = model

    def render(
        self,
        log_densities: Sequence[float],
        model: Any,
        rank_seconds: Sequence[float],
        axis_steps: int | None = None,
        earlier_seconds: Sequence[Sequence[float]] = (),
    ) -> bytes:
        """Draw the steps so far and return the figure as PNG bytes.

        Parameters
        ----------
        log_densities : sequence of float
            Each step's log-density.
        model
            The current model, for the model picture.
        rank_seconds : sequence of float
            Each rank's E-step seconds in the last step, drawn as bars.
        axis_steps : int, optional
            The steps the step axes hold (default: the steps drawn; see :func:`fit_steps`).
        earlier_seconds : sequence of sequences of float
            Each rank's E-step seconds in steps before the last: the bars' axis fits
            them too, so that it does not follow every step's noise.

        Returns
        -------
        bytes
            The PNG.
        """
        steps = np.arange(1, len(log_densities) + 1)
        g = gains(log_densities)
        self.objective_line.set_data(steps, log_densities)
        self.gain_line.set_data(steps[1:], g)
        reach = len(steps) if axis_steps is None else max(axis_steps, len(steps))
        for ax, values, log in ((self.objective, log_densities, False), (self.convergence, g, True)):
            if fit_limits(ax, values, log=log, min_span=LOG_MIN_DECADES if log else None):  # no minor ticks
                self.live.invalidate(ax, "y limits")
            if fit_steps(ax, reach):  # the step axes' data artists are all dynamic
                self.live.invalidate(ax, "x limits")
        changed = self._rank_bars(rank_seconds, earlier_seconds)
        if changed is not None:  # the bars are dynamic: new limits leave the x axis as it was
            self.live.invalidate(self.ranks, changed)
        if model is not self.model:
            if self.picture.update(model):
                self.live.invalidate(self.picture.ax)
            self.model = model
        return self.live.png()

    def _rank_bars(self, seconds: Sequence[float], earlier: Sequence[Sequence[float]]) -> str | None:
        """Each rank's last E-step in milliseconds, the axis fitted to them and the ``earlier``
        ones; what changed, for :meth:`LiveFigure.invalidate` (None: nothing)."""
        changed = None
        if seconds and len(seconds) != len(self.bars):  # no steps (a reset): keep the bars, at 0
            self.live.forget(self.bars)
            container = self.ranks.bar(np.arange(len(seconds)), np.zeros(len(seconds)), color="#2980b9")
            self.bars = [self.live.dynamic(p) for p in container.patches]
            self.ranks.set_xticks(np.arange(len(seconds)), [str(r) for r in range(len(seconds))])
            self.ranks.set_xlim(-0.6, max(len(seconds), 1) - 0.4)
            changed = "all"
        if not seconds:
            for bar in self.bars:
                bar.set_height(0.0)
            return changed
        ms = [1e3 * s for s in seconds]
        for bar, height in zip(self.bars, ms):
            bar.set_height(height)
        shown = [0.0, *ms, *recent_times_ms(earlier, ms)]
        if fit_limits(self.ranks, shown, floor=0.0):
            return changed or "y limits"
        return changed


def recent_times_ms(earlier: Sequence[Sequence[float]], last_ms: Sequence[float]) -> list[float]:
    """The earlier steps' E-step times (seconds) in milliseconds, less those over
    :data:`SLOW_STEP` times the median of them and the last step's: a warm-up or a run's first
    step would otherwise keep the bars' axis tall, the bars squashed, for a window of steps."""
    times = [1e3 * s for step in earlier for s in step]
    if not times:
        return []
    bound = SLOW_STEP * float(np.median([*times, *last_ms]))
    return [t for t in times if t <= bound]


def choose_k_png(
    k: Sequence[int], bic: Sequence[float], aic: Sequence[float], best_k: int, parts: str = "components"
) -> bytes:
    """BIC (and AIC) against K (``parts``: what K counts), the chosen K (the lowest BIC)
    marked: drawn once, when the fits are done."""
    fig = Figure(figsize=(5.0, 3.0), dpi=DPI)
    ax = fig.subplots()
    fig.subplots_adjust(left=0.2, right=0.97, bottom=0.17, top=0.88)
    ax.plot(k, bic, "o-", color="#2c3e50", label="BIC")
    ax.plot(k, aic, "s--", color="#7f8c8d", ms=4, label="AIC")
    best = list(k).index(best_k)
    ax.plot([k[best]], [bic[best]], "o", ms=12, mfc="none", mec="#c0392b", mew=2, label=f"best K = {k[best]}")
    ax.set_title("choose K: information criteria (lower is better)", fontsize=10)
    ax.set_xlabel(f"K ({parts})", fontsize=9, labelpad=1)
    ax.set_xticks(list(k))
    ax.legend(fontsize=8)
    return static_png(fig)
