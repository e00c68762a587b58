"""The model picture in the EM panel, for our models and mixle's alike (recognised by their
parameters, never by type): a density over a histogram for 1-D Gaussians; each component's
2-sigma ellipse over the data for D >= 2 Gaussians (two chosen dimensions, or the data's first
two principal components); bars per component for categorical and Poisson mixtures; and a
plain "no picture for this model" otherwise."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
from matplotlib.axes import Axes
from matplotlib.patches import Ellipse

from .axis_limits import fit_limits
from .live_figure import LiveFigure

NO_PICTURE = "no picture for this model"
MAX_CATEGORIES = 12  # the most probable ones; more bars would not be readable
MAX_COUNT = 60  # Poisson bars stop here
COLOURS = ["#c0392b", "#2980b9", "#27ae60", "#8e44ad", "#d35400", "#16a085", "#2c3e50", "#7f8c8d"]


def colour(k: int) -> str:
    """Component (or state) ``k``'s colour, the same in every picture."""
    return COLOURS[k % len(COLOURS)]


def components(model: Any) -> list:
    """``[(weight, component)]``: a mixture's, or the model itself with weight 1."""
    if hasattr(model, "components") and hasattr(model, "w"):
        return list(zip(np.asarray(model.w, dtype=float).ravel(), model.components))
    return [(1.0, model)]


def owners(model: Any) -> np.ndarray:
    """Per component, the part it belongs to: ``model.owners`` where the model groups its
    components (an HMM's Gaussian-mixture states), else each component its own part."""
    owner = getattr(model, "owners", None)
    return np.arange(len(components(model))) if owner is None else np.asarray(owner, dtype=int)


def gaussian(component: Any) -> tuple[np.ndarray, np.ndarray] | None:
    """``(mean, covariance)`` of a Gaussian-family component (full, diagonal or spherical; ours
    keep ``sigma2``/``covar``, mixle's ``sigma2``/``covar``), else None."""
    name = type(component).__name__
    if "Gaussian" not in name or name.startswith("Log") or not hasattr(component, "mu"):
        return None
    mu = np.atleast_1d(np.asarray(component.mu, dtype=float))
    spread = getattr(component, "covar", getattr(component, "sigma2", None))
    if spread is None:
        return None
    spread = np.asarray(spread, dtype=float)
    cov = spread if spread.ndim == 2 else np.diag(np.broadcast_to(spread, mu.shape))
    return mu, cov


def gaussians(model: Any) -> list[tuple[float, np.ndarray, np.ndarray]]:
    """``[(weight, mean, covariance)]`` of a model whose components are all Gaussian.

    Parameters
    ----------
    model
        A mixture of Gaussians, or one Gaussian (ours or mixle's).

    Returns
    -------
    list of tuple
        One ``(weight, mean, covariance)`` per component.

    Raises
    ------
    TypeError
        A component is not of the Gaussian family.
    """
    out = []
    for w, c in components(model):
        params = gaussian(c)
        if params is None:
            raise TypeError(f"not a Gaussian component: {type(c).__name__}")
        out.append((float(w), *params))
    return out


def picture_kind(model: Any) -> str | None:
    """``"density"`` (1-D Gaussians), ``"ellipses"`` (D >= 2 Gaussians), ``"categorical"``,
    ``"poisson"``, or None when every component is not of one family we can draw."""
    comps = [c for _, c in components(model)]
    means = [p[0] for p in map(gaussian, comps) if p is not None]
    if len(means) == len(comps) and len({len(mu) for mu in means}) == 1:
        return "density" if len(means[0]) == 1 else "ellipses"
    if all(isinstance(getattr(c, "pmap", None), dict) for c in comps):
        return "categorical"
    if all("Poisson" in type(c).__name__ and hasattr(c, "lam") for c in comps):
        return "poisson"
    return None


def projection(model: Any, data: np.ndarray | None, dims: Sequence[int] | None) -> tuple[np.ndarray, list]:
    """A 2 x D matrix and its axis labels: the chosen dimensions, else (D > 2 with data) the
    data's first two principal components, else dimensions 0 and 1."""
    d = len(gaussians(model)[0][1])
    if dims is None and d > 2 and data is not None and np.ndim(data) == 2 and data.shape[1] == d and len(data) > 2:
        _, vectors = np.linalg.eigh(np.cov(data, rowvar=False))
        return vectors[:, ::-1][:, :2].T, ["PC1", "PC2"]
    i, j = (0, 1) if dims is None else (int(dims[0]), int(dims[1]))
    if not (0 <= i < d and 0 <= j < d and i != j):
        raise ValueError(f"picture_dims must be two different dimensions in 0..{d - 1}; got {dims!r}")
    matrix = np.zeros((2, d))
    matrix[0, i] = matrix[1, j] = 1.0
    return matrix, [f"dim {i}", f"dim {j}"]


class ModelPicture:
    """Draws a model on ``ax`` of a :class:`LiveFigure`; :meth:`update` redraws it for a new
    model of the same shape (the data, axes and labels stay in the background). ``part`` names
    a mixture's parts in the labels; ``"state"`` (an HMM's emissions, weighted) also draws each
    part's weighted density under the 1-D total."""

    def __init__(
        self,
        live: LiveFigure,
        ax: Axes,
        model: Any,
        data: np.ndarray | None,
        dims: Sequence[int] | None = None,
        part: str = "component",
    ) -> None:
        self.live, self.ax, self.part = live, ax, part
        self.part_lines: list = []
        self.data = None if data is None else np.asarray(data)
        self.kind = picture_kind(model)
        if self.kind == "density":
            self._build_density(model)
        elif self.kind == "ellipses":
            self._build_ellipses(model, dims)
        elif self.kind == "categorical":
            self._build_categorical(model)
        elif self.kind == "poisson":
            self._build_poisson(model)
        else:
            ax.set_title("model", fontsize=10)
            ax.text(0.5, 0.5, NO_PICTURE, ha="center", va="center", transform=ax.transAxes)
            ax.set_xticks([])
            ax.set_yticks([])

    def update(self, model: Any) -> bool:
        """Redraw for ``model``; whether the limits changed (the background must be redrawn)."""
        if self.kind is None or picture_kind(model) != self.kind:
            return False
        return {
            "density": self._update_density,
            "ellipses": self._update_ellipses,
            "categorical": self._update_bars,
            "poisson": self._update_bars,
        }[self.kind](model)

    # -- 1-D Gaussians: density over a histogram ----------------------------------------------

    def _build_density(self, model: Any) -> None:
        self.ax.set_title("model vs data", fontsize=10)
        x = self.data if self.data is not None and np.ndim(self.data) == 1 else None
        if x is not None:
            heights, edges = np.histogram(x, bins=60, density=True)
            self.ax.stairs(heights, edges, fill=True, color="#c8d3e0")
            self.grid = np.linspace(np.min(x), np.max(x), 400)
            self._histogram_top = heights.max()
        else:
            mus = [mu[0] for _, mu, _ in gaussians(model)]
            sds = [math.sqrt(cov[0, 0]) for _, _, cov in gaussians(model)]
            self.grid = np.linspace(min(mus) - 4 * max(sds), max(mus) + 4 * max(sds), 400)
            self._histogram_top = 0.0
        self.ax.set_xlim(self.grid[0], self.grid[-1])
        if self.part == "state":
            self.part_lines = [
                self.live.dynamic(self.ax.plot(self.grid, np.zeros_like(self.grid), color=colour(k), lw=1.5)[0])
                for k in range(int(owners(model).max()) + 1)
            ]
        total_colour = "black" if self.part_lines else "#c0392b"
        self.line = self.live.dynamic(self.ax.plot(self.grid, np.zeros_like(self.grid), color=total_colour, lw=2)[0])
        self._update_density(model)

    def _update_density(self, model: Any) -> bool:
        parts = np.zeros((max(len(self.part_lines), 1), len(self.grid)))
        for owner, (w, mu, cov) in zip(owners(model), gaussians(model)):
            var = cov[0, 0]
            parts[owner if self.part_lines else 0] += (
                w * np.exp(-0.5 * (self.grid - mu[0]) ** 2 / var) / math.sqrt(2 * math.pi * var)
            )
        for line, part in zip(self.part_lines, parts):
            line.set_ydata(part)
        density = parts.sum(axis=0)
        self.line.set_ydata(density)
        return fit_limits(self.ax, [0.0, self._histogram_top, density.max()], floor=0.0)

    # -- D >= 2 Gaussians: ellipses over the data ------------------------------------------------

    def _build_ellipses(self, model: Any, dims: Sequence[int] | None) -> None:
        self.matrix, labels = projection(model, self.data, dims)
        self.ax.set_title(f"model vs data ({labels[0]}, {labels[1]})", fontsize=10)
        self.ax.set_xlabel(labels[0], fontsize=9, labelpad=1)
        self.ax.set_ylabel(labels[1], fontsize=9, labelpad=1)
        self._data_points = np.empty((0, 2))
        if self.data is not None and np.ndim(self.data) == 2 and self.data.shape[1] == self.matrix.shape[1]:
            self._data_points = self.data @ self.matrix.T
            self.ax.scatter(
                self._data_points[:, 0], self._data_points[:, 1], s=3, color="#7f8c8d", alpha=0.4, linewidths=0
            )
        self.ellipses = []
        for owner in owners(model):
            ellipse = Ellipse((0, 0), 1, 1, fill=False, color=colour(int(owner)))
            self.ax.add_patch(ellipse)
            self.ellipses.append(self.live.dynamic(ellipse))
        self._update_ellipses(model)

    def _update_ellipses(self, model: Any) -> bool:
        corners = [self._data_points]
        for ellipse, (w, mu, cov) in zip(self.ellipses, gaussians(model)):
            centre, cov2 = self.matrix @ mu, self.matrix @ cov @ self.matrix.T
            values, vectors = np.linalg.eigh(cov2)
            values = np.clip(values, 0.0, None)
            ellipse.set_center(centre)
            ellipse.width, ellipse.height = 4 * np.sqrt(values[::-1])  # 2 sigma either side
            ellipse.angle = math.degrees(math.atan2(vectors[1, 1], vectors[0, 1]))
            ellipse.set_linewidth(1 + 3 * w)
            reach = 2 * np.sqrt(np.diag(cov2))
            corners.append(np.array([centre - reach, centre + reach]))
        points = np.concatenate(corners)
        changed_x = fit_limits(self.ax, points[:, 0], axis="x")
        changed_y = fit_limits(self.ax, points[:, 1], axis="y")
        return changed_x or changed_y

    # -- categorical and Poisson: bars per component ---------------------------------------------

    def _build_categorical(self, model: Any) -> None:
        totals: dict = {}
        for w, c in components(model):
            for key, p in c.pmap.items():
                totals[key] = totals.get(key, 0.0) + w * p
        self.labels = sorted(totals, key=lambda key: -totals[key])[:MAX_CATEGORIES]
        self.ax.set_title(f"category probability per {self.part}", fontsize=10)
        self._build_bars(model, [str(key) for key in self.labels])

    def _build_poisson(self, model: Any) -> None:
        top = max(c.lam + 4 * math.sqrt(c.lam) for _, c in components(model))
        if self.data is not None and np.ndim(self.data) == 1 and len(self.data):
            top = max(top, float(np.max(self.data)))
        self.labels = list(range(int(min(math.ceil(top), MAX_COUNT)) + 1))
        self.ax.set_title(f"count probability per {self.part}", fontsize=10)
        if self.data is not None and np.ndim(self.data) == 1 and len(self.data):
            counts = np.bincount(
                np.clip(np.asarray(self.data, dtype=int), 0, self.labels[-1]), minlength=len(self.labels)
            )
            self.ax.stairs(counts / counts.sum(), np.arange(len(self.labels) + 1) - 0.5, color="#7f8c8d", label="data")
        self._build_bars(model, None)

    def _build_bars(self, model: Any, tick_labels: Sequence[str] | None) -> None:
        k = len(components(model))
        width = 0.8 / k
        x = np.arange(len(self.labels))
        self.bars = []
        for j in range(k):
            container = self.ax.bar(
                x - 0.4 + width * (j + 0.5),
                np.zeros(len(x)),
                width,
                color=colour(j),
                label=f"{self.part} {j}",
            )
            self.bars.append([self.live.dynamic(patch) for patch in container.patches])
        if tick_labels is not None:
            self.ax.set_xticks(x, tick_labels, fontsize=8, rotation=45 if len(x) > 6 else 0)
        self.ax.set_xlim(-0.6, len(x) - 0.4)
        self._update_bars(model)

    def _update_bars(self, model: Any) -> bool:
        top = 0.0
        for patches, (_w, c) in zip(self.bars, components(model)):
            if self.kind == "categorical":
                heights = [float(c.pmap.get(key, 0.0)) for key in self.labels]
            else:
                x = np.asarray(self.labels, dtype=float)
                heights = np.exp(x * math.log(max(c.lam, 1e-300)) - c.lam - np.array([math.lgamma(v + 1) for v in x]))
            for patch, h in zip(patches, heights):
                patch.set_height(h)
            top = max(top, max(heights))
        return fit_limits(self.ax, [0.0, top], floor=0.0)
