"""The training panel's figure, kept between redraws: each rank's loss (faint), an
exponentially smoothed mean over ranks (bold), held-out loss points, and the entropy floor
(the lowest loss any model can reach on the source, where it is known).

The y axis fits the losses (all of them, or with ``fit_recent`` those of the latest half of
the steps, the first steps running off the top); the entropy floor is drawn where it falls and
not fitted, so a floor far below the curves does not squash them: the legend says when it is
below the axes."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from matplotlib.lines import Line2D

from .axis_limits import fit_limits
from .live_figure import LiveFigure

FIGSIZE = (9.0, 3.2)
X_AXES = {"steps": "optimizer step", "targets": "targets (tokens whose loss was taken)"}


def mean_curve(curves: dict) -> list:
    """Mean loss over ranks at each step every rank has reported: ``[(step, loss)]``."""
    by_step: dict = {}
    for points in curves.values():
        for step, loss in points:
            by_step.setdefault(step, []).append(loss)
    return [(s, float(np.mean(v))) for s, v in sorted(by_step.items()) if len(v) == len(curves)]


def smoothed(values: Sequence[float], smoothing: float) -> np.ndarray:
    """Exponential moving average with the start-up bias removed (as TensorBoard does), so the
    first points are not pulled towards zero."""
    out, avg, weight = np.empty(len(values)), 0.0, 0.0
    for i, v in enumerate(values):
        avg = smoothing * avg + (1 - smoothing) * v
        weight = smoothing * weight + (1 - smoothing)
        out[i] = avg / weight
    return out


class LossView:
    """The loss plot of a :class:`~.train_panel.TrainPanel`; draw it with :meth:`render`.

    Parameters
    ----------
    x_axis : {"steps", "targets"}
        What the x axis counts.
    log_scale : bool
        A log y axis.
    entropy_floor : float, optional
        The source's entropy (nats), drawn as a dashed line.
    smoothing : float
        The exponential smoothing of the mean curve (0: none).
    fit_recent : bool
        Fit the y axis to the latest half of the steps only (the first steps, far above the
        later ones, run off the top).
    """

    def __init__(
        self,
        x_axis: str = "steps",
        log_scale: bool = False,
        entropy_floor: float | None = None,
        smoothing: float = 0.8,
        fit_recent: bool = False,
    ):
        self.x_axis, self.log_scale, self.entropy_floor, self.smoothing = x_axis, log_scale, entropy_floor, smoothing
        self.fit_recent = fit_recent
        self.live = LiveFigure(FIGSIZE)
        self.ax = self.live.figure.subplots()
        self.live.figure.subplots_adjust(left=0.08, right=0.98, bottom=0.16, top=0.9)
        self.ax.set_title("streaming loss: each rank (faint), smoothed mean over ranks (bold)", fontsize=10)
        self.ax.set_xlabel(X_AXES[x_axis], fontsize=9, labelpad=1)
        self.ax.set_ylabel("next-token loss (nats)", fontsize=9)
        if log_scale:
            self.ax.set_yscale("log")
        self.raw: dict[int, Line2D] = {}
        self.mean = self.live.dynamic(self.ax.plot([], [], lw=2.5, color="black", label="mean (smoothed)")[0])
        # in the legend once there is a held-out point (an underscore label is left out)
        self.held_out = self.live.dynamic(self.ax.plot([], [], "D", color="#c0392b", ms=6, label="_held-out")[0])
        self.floor: Line2D | None = None
        if entropy_floor is not None:
            floor = self.ax.axhline(entropy_floor, ls="--", color="gray", label=self._floor_label(True))
            self.floor = self.live.dynamic(floor)  # so that new y limits leave the body as it is
        self._legend()

    def _floor_label(self, shown: bool) -> str:
        return f"entropy floor {self.entropy_floor:.3f}{'' if shown else ' (below the axes)'}"

    def _legend(self) -> None:
        self.ax.legend(fontsize=8, loc="upper right")

    def render(self, points: dict, held_out: list) -> bytes:
        """Draw the curves and return the figure as PNG bytes.

        Parameters
        ----------
        points : dict
            rank -> ``[(step, targets, loss)]``.
        held_out : list
            ``[(step, targets, loss)]``.

        Returns
        -------
        bytes
            The PNG.
        """
        column = 0 if self.x_axis == "steps" else 1
        changed = False
        curves: list[np.ndarray] = []  # (x, loss) of every point drawn
        for rank, pts in sorted(points.items()):
            if rank not in self.raw:
                self.raw[rank] = self.live.dynamic(self.ax.plot([], [], lw=1, alpha=0.3, label=f"rank {rank}")[0])
                self._legend()
                changed = True
            if pts:
                arr = np.asarray(pts, dtype=float)
                self.raw[rank].set_data(arr[:, column], arr[:, 2])
                curves.append(arr[:, [column, 2]])
        mean = mean_curve({r: [(p[column], p[2]) for p in pts] for r, pts in points.items()})
        if mean:
            x, y = np.asarray(mean).T
            self.mean.set_data(x, smoothed(y, self.smoothing))
            curves.append(np.column_stack([x, self.mean.get_ydata()]))
        if held_out:
            if self.held_out.get_label() != "held-out":
                self.held_out.set_label("held-out")
                self._legend()
                changed = True
            arr = np.asarray(held_out, dtype=float)
            self.held_out.set_data(arr[:, column], arr[:, 2])
            curves.append(arr[:, [column, 2]])
        drawn = np.concatenate(curves) if curves else np.empty((0, 2))
        if fit_limits(self.ax, np.append(drawn[:, 0], 0.0), axis="x", floor=0.0):  # the lines are all dynamic;
            self.live.invalidate(self.ax, "x limits")  # the legend is in axes coordinates
        if fit_limits(self.ax, self._fitted_losses(drawn), log=self.log_scale):
            self.live.invalidate(self.ax, "y limits")
        changed |= self._label_floor()
        if changed:  # the legend
            self.live.invalidate(self.ax, "body")
        return self.live.png()

    def _fitted_losses(self, drawn: np.ndarray) -> np.ndarray:
        """The losses the y axis fits: all drawn, or with ``fit_recent`` the latest half's."""
        if not self.fit_recent or not len(drawn):
            return drawn[:, 1]
        return drawn[drawn[:, 0] >= 0.5 * drawn[:, 0].max(), 1]

    def _label_floor(self) -> bool:
        """Say in the legend whether the entropy floor is below the axes; whether that changed."""
        if self.floor is None or self.entropy_floor is None:
            return False
        label = self._floor_label(self.ax.get_ylim()[0] <= self.entropy_floor)
        if label == self.floor.get_label():
            return False
        self.floor.set_label(label)
        self._legend()
        return True
