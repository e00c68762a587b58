"""The training panel's figure, kept between redraws: each rank's loss (faint), an
exponentially smoothed mean over ranks (bold), held-out loss points, and the entropy floor
(the lowest loss any model can reach on the source, where it is known)."""

from __future__ import annotations

import numpy as np

from .live_figure import LiveFigure, fit_limits

FIGSIZE = (9.0, 3.2)
X_AXES = {"steps": "optimizer step", "targets": "targets (tokens whose loss was taken)"}


def mean_curve(curves: dict) -> list:
    """Mean loss over ranks at each step every rank has reported: ``[(step, loss)]``."""
    by_step: dict = {}
    for points in curves.values():
        for step, loss in points:
            by_step.setdefault(step, []).append(loss)
    return [(s, float(np.mean(v))) for s, v in sorted(by_step.items()) if len(v) == len(curves)]


def smoothed(values, smoothing: float) -> np.ndarray:
    """Exponential moving average with the start-up bias removed (as TensorBoard does), so the
    first points are not pulled towards zero."""
    out, avg, weight = np.empty(len(values)), 0.0, 0.0
    for i, v in enumerate(values):
        avg = smoothing * avg + (1 - smoothing) * v
        weight = smoothing * weight + (1 - smoothing)
        out[i] = avg / weight
    return out


class LossView:
    """Draw with :meth:`render`; ``x_axis`` is ``"steps"`` or ``"targets"``."""

    def __init__(
        self, x_axis: str = "steps", log_scale: bool = False, entropy_floor: float | None = None, smoothing: float = 0.8
    ):
        self.x_axis, self.log_scale, self.entropy_floor, self.smoothing = x_axis, log_scale, entropy_floor, smoothing
        self.live = LiveFigure(FIGSIZE)
        self.ax = self.live.figure.subplots()
        self.live.figure.subplots_adjust(left=0.08, right=0.98, bottom=0.16, top=0.9)
        self.ax.set_title("streaming loss: each rank (faint), smoothed mean over ranks (bold)", fontsize=10)
        self.ax.set_xlabel(X_AXES[x_axis], fontsize=9, labelpad=1)
        self.ax.set_ylabel("next-token loss (nats)", fontsize=9)
        if log_scale:
            self.ax.set_yscale("log")
        self.ax.set_ylim(*((0.5, 20) if log_scale else (0, 10)))  # room below the usual entropy floors
        self.ax.set_xlim(0, 10)
        self.raw: dict[int, object] = {}
        self.mean = self.live.dynamic(self.ax.plot([], [], lw=2.5, color="black", label="mean (smoothed)")[0])
        # in the legend once there is a held-out point (an underscore label is left out)
        self.held_out = self.live.dynamic(self.ax.plot([], [], "D", color="#c0392b", ms=6, label="_held-out")[0])
        if entropy_floor is not None:
            self.ax.axhline(entropy_floor, ls="--", color="gray", label=f"entropy floor {entropy_floor:.3f}")
        self._legend()

    def _legend(self) -> None:
        self.ax.legend(fontsize=8, loc="upper right")

    def render(self, points: dict, held_out: list) -> bytes:
        """``points``: rank -> [(step, targets, loss)]; ``held_out``: [(step, targets, loss)]."""
        column = 0 if self.x_axis == "steps" else 1
        changed = False
        xs, ys = [0.0], []
        for rank, pts in sorted(points.items()):
            if rank not in self.raw:
                self.raw[rank] = self.live.dynamic(self.ax.plot([], [], lw=1, alpha=0.3, label=f"rank {rank}")[0])
                self._legend()
                changed = True
            if pts:
                arr = np.asarray(pts, dtype=float)
                self.raw[rank].set_data(arr[:, column], arr[:, 2])
                xs.append(arr[-1, column])
                ys.extend(arr[:, 2])
        mean = mean_curve({r: [(p[column], p[2]) for p in pts] for r, pts in points.items()})
        if mean:
            x, y = np.asarray(mean).T
            self.mean.set_data(x, smoothed(y, self.smoothing))
        if held_out:
            if self.held_out.get_label() != "held-out":
                self.held_out.set_label("held-out")
                self._legend()
                changed = True
            arr = np.asarray(held_out, dtype=float)
            self.held_out.set_data(arr[:, column], arr[:, 2])
            xs.append(arr[:, column].max())
            ys.extend(arr[:, 2])
        if self.entropy_floor is not None:
            ys.append(self.entropy_floor)
        if fit_limits(self.ax, [0.0, max(xs)], axis="x", floor=0.0):  # the curves are all dynamic; the legend
            self.live.invalidate(self.ax, "x limits")  # and floor's x are axes coordinates
        if fit_limits(self.ax, ys, log=self.log_scale):
            self.live.invalidate(self.ax, "y limits")
        if changed:  # the legend
            self.live.invalidate(self.ax)
        return self.live.png()
