"""Figures as PNG bytes: rendered once per redraw with Agg, shown in an ``ipywidgets.Image``.
A PNG works the same in JupyterLab, VS Code and nbconvert, and a saved notebook keeps only
the last one."""
from __future__ import annotations

import io
import math
from typing import Optional, Sequence

# Figure.savefig renders PNG with Agg by itself. No pyplot backend is selected here, so importing
# the panels leaves the notebook's own backend (inline plots) alone.
import numpy as np
from matplotlib.figure import Figure
from matplotlib.patches import Ellipse

from ..stats import (
    DiagonalGaussianDistribution,
    MixtureDistribution,
    MultivariateGaussianDistribution,
)


def to_png(fig: Figure) -> bytes:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=72)
    return buffer.getvalue()


def _components(model):
    if isinstance(model, MixtureDistribution):
        return list(zip(model.w, model.components))
    return [(1.0, model)]


def _covariance(component) -> Optional[np.ndarray]:
    if isinstance(component, MultivariateGaussianDistribution) and len(component.mu) == 2:
        return component.covar
    if isinstance(component, DiagonalGaussianDistribution) and np.size(component.mu) == 2:
        return np.diag(component.sigma2)
    return None


def draw_model(ax, model, data: Optional[np.ndarray]) -> None:
    """1-D: density over a histogram of the data; 2-D Gaussians: 2σ ellipses over a scatter."""
    ax.set_title("model vs data", fontsize=10)
    comps = _components(model)
    covariances = [_covariance(c) for _, c in comps]
    if data is not None and np.ndim(data) == 1:
        ax.hist(data, bins=60, density=True, color="#c8d3e0")
        grid = np.linspace(np.min(data), np.max(data), 400)
        encoder = model.dist_to_encoder()
        ax.plot(grid, np.exp(model.seq_log_density(encoder.seq_encode(grid))), color="#c0392b", lw=2)
    elif all(c is not None for c in covariances):
        if data is not None:
            ax.scatter(data[:, 0], data[:, 1], s=3, color="#7f8c8d", alpha=0.4)
        for (w, comp), cov in zip(comps, covariances):
            values, vectors = np.linalg.eigh(cov)
            angle = math.degrees(math.atan2(vectors[1, 1], vectors[0, 1]))
            width, height = 4 * np.sqrt(values[::-1])
            ax.add_patch(Ellipse(np.asarray(comp.mu), width, height, angle=angle, fill=False,
                                 color="#c0392b", lw=1 + 3 * w))
        ax.autoscale_view()
    else:
        ax.text(0.5, 0.5, "no picture for this model", ha="center", va="center", transform=ax.transAxes)


def em_figure(log_densities: Sequence[float], model, data, rank_seconds: Sequence[float],
              distributed: bool = True) -> bytes:
    """The EM panel's three plots in one figure: objective per step, model vs data, E-step time per rank."""
    fig = Figure(figsize=(12, 3.2))
    objective, picture, ranks = fig.subplots(1, 3)
    objective.set_title(f"{'all-reduced ' if distributed else ''}log-density per EM step", fontsize=10)
    if log_densities:
        objective.plot(range(1, len(log_densities) + 1), log_densities, "o-", color="#2c3e50", ms=3)
    objective.set_xlabel("EM step")
    draw_model(picture, model, data)
    ranks.set_title(f"E-step seconds {'per rank' if distributed else '(this process)'}, last step", fontsize=10)
    if rank_seconds:
        ranks.bar([str(r) for r in range(len(rank_seconds))], rank_seconds, color="#2980b9")
    ranks.set_xlabel("rank")
    fig.tight_layout()
    return to_png(fig)


def loss_figure(curves: dict, entropy_floor: Optional[float] = None) -> bytes:
    """Streaming loss per rank (thin) and their mean (thick) against optimizer step."""
    fig = Figure(figsize=(8, 3.2))
    ax = fig.subplots()
    ax.set_title("streaming loss per rank and mean", fontsize=10)
    for rank, points in sorted(curves.items()):
        if points:
            steps, losses = zip(*points)
            ax.plot(steps, losses, lw=1, alpha=0.6, label=f"rank {rank}")
    mean = mean_curve(curves)
    if mean:
        steps, losses = zip(*mean)
        ax.plot(steps, losses, lw=2.5, color="black", label="mean")
    if entropy_floor is not None:
        ax.axhline(entropy_floor, ls="--", color="gray")
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("next-token loss (nats)")
    if curves:
        ax.legend(fontsize=8, loc="upper right")
    fig.tight_layout()
    return to_png(fig)


def mean_curve(curves: dict) -> list:
    """Mean loss over ranks at each step every rank has reported."""
    by_step: dict = {}
    for points in curves.values():
        for step, loss in points:
            by_step.setdefault(step, []).append(loss)
    return [(s, float(np.mean(v))) for s, v in sorted(by_step.items()) if len(v) == len(curves)]
