"""The EM panel's picture of a hidden Markov model (ours, recognised by its parameters): the
transition matrix as a heat map with each probability written in its cell; each state's
emission over the data (1-D Gaussian densities over a histogram, bars of probabilities for
categorical and Poisson states, 2-sigma ellipses for D >= 2 Gaussians: a
:class:`~.model_picture.ModelPicture` of the states weighted by their share of the sequence;
a state that emits from a Gaussian mixture, as ``GMMHMM``'s, draws its mixture's density in
1-D and each of its components' ellipses, in the state's colour, for D >= 2);
and one sequence's observations coloured by their most likely (Viterbi) states."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from matplotlib.axes import Axes

from ..stats.hmm.columns import ColumnsDistribution
from .axis_limits import fit_limits
from .live_figure import LiveFigure
from .model_picture import ModelPicture, colour, components, gaussian

SEQUENCE_STEPS = 500  # the time steps of the sequence drawn, decoded and histogrammed
NO_SEQUENCE = "no sequence to draw"
DARK_CELL = 0.6  # cells above this probability write their value in white


def is_hmm(model: Any) -> bool:
    """Whether ``model`` is a hidden Markov model the picture can decode (ours)."""
    return all(hasattr(model, name) for name in ("transmat", "emissions", "seq_viterbi", "seq_posteriors"))


@dataclass
class StateEmissions:
    """An HMM's states as a mixture for :class:`ModelPicture`: component i weighted by
    ``w[i]`` and belonging to state ``owners[i]``. A state's weight is its share of the
    sequence's posteriors; a Gaussian-mixture state gives one component per mixture
    component, weighted by the state's share times the component's weight."""

    w: np.ndarray
    components: list
    owners: np.ndarray


def state_emissions(model: Any, weights: np.ndarray) -> StateEmissions:
    """``model``'s states, weighted, as a mixture :class:`ModelPicture` draws."""
    w, parts, owners = [], [], []
    for state, (share, emission) in enumerate(zip(weights, model.emissions)):
        for weight, part in gaussian_parts(single_column(emission)):
            w.append(share * weight)
            parts.append(part)
            owners.append(state)
    return StateEmissions(np.asarray(w, dtype=float), parts, np.asarray(owners))


def gaussian_parts(emission: Any) -> list:
    """``[(weight, component)]`` of a mixture of Gaussians (a ``GMMHMM`` state), else
    ``[(1, emission)]``."""
    parts = components(emission)
    return parts if all(gaussian(c) is not None for _, c in parts) else [(1.0, emission)]


def single_column(emission: Any) -> Any:
    """A one-column product (a one-feature ``PoissonHMM`` state) as its column's distribution."""
    if isinstance(emission, ColumnsDistribution) and len(emission.components) == 1:
        return emission.components[0]
    return emission


def drawn_values(sequence: np.ndarray) -> np.ndarray:
    """One value per time step to plot: the observation, or its first dimension; symbols that
    are not numbers by their position among the sorted symbols."""
    values = sequence[:, 0] if sequence.ndim == 2 else sequence
    if values.dtype.kind not in "biuf":
        values = np.unique(values, return_inverse=True)[1]
    return np.asarray(values, dtype=float)


class HMMPicture:
    """Draws an HMM on three axes of a :class:`LiveFigure` (transitions, emissions, sequence);
    :meth:`update` redraws it for a new model with as many states.

    ``sequence`` is one sequence's observations as its encoding keeps them ((T, D) or (T,)),
    or None; its first :data:`SEQUENCE_STEPS` are drawn."""

    kind = "hmm"

    def __init__(self, live: LiveFigure, axes: Sequence[Axes], model: Any, sequence: np.ndarray | None) -> None:
        self.live = live
        self.transitions_ax, self.emissions_ax, self.sequence_ax = axes
        self.sequence = None if sequence is None else np.asarray(sequence)[:SEQUENCE_STEPS]
        self._encoding = None
        if self.sequence is not None and len(self.sequence):
            self._encoding = model.dist_to_encoder().seq_encode([self.sequence])
        self._build_transitions(model)
        weights, path = self._decode(model)
        emission_data = None
        if self.sequence is not None:
            emission_data = (
                self.sequence[:, 0] if self.sequence.ndim == 2 and self.sequence.shape[1] == 1 else self.sequence
            )
        self.emissions = ModelPicture(
            live,
            self.emissions_ax,
            state_emissions(model, weights),
            emission_data,
            part="state",
        )
        if self.emissions.kind in ("density", "ellipses"):
            self.emissions_ax.set_title("each state's emission, by its share, vs data", fontsize=10)
        self._build_sequence(path)

    @property
    def ax(self) -> Axes:
        """The axes whose limits follow the model (the emissions')."""
        return self.emissions_ax

    def update(self, model: Any) -> bool:
        """Redraw for ``model``; whether the emission axes' limits changed."""
        self.heat.set_data(model.transmat)
        self._write_cells(model.transmat)
        weights, path = self._decode(model)
        if path is not None:
            self.points.set_facecolor(state_colours(path))
        return self.emissions.update(state_emissions(model, weights))

    def _decode(self, model: Any) -> tuple[np.ndarray, np.ndarray | None]:
        """Each state's share of the sequence's posteriors (uniform without a sequence) and the
        sequence's Viterbi path."""
        if self._encoding is None:
            return np.full(model.n_states, 1.0 / model.n_states), None
        posteriors = model.seq_posteriors(self._encoding)[1]
        return posteriors.mean(axis=0), model.seq_viterbi(self._encoding)[1]

    # -- the transition matrix -------------------------------------------------------------

    def _build_transitions(self, model: Any) -> None:
        ax, k = self.transitions_ax, model.n_states
        self.heat = self.live.dynamic(ax.imshow(model.transmat, vmin=0.0, vmax=1.0, cmap="Blues"))
        size = 9 if k <= 4 else 7 if k <= 8 else 5
        self.cells = [
            [self.live.dynamic(ax.text(j, i, "", ha="center", va="center", fontsize=size)) for j in range(k)]
            for i in range(k)
        ]
        ax.set_title("transition probabilities", fontsize=10)
        ax.set_xlabel("to state", fontsize=9, labelpad=1)
        ax.set_ylabel("from state", fontsize=9, labelpad=1)
        ax.set_xticks(range(k))
        ax.set_yticks(range(k))
        for labels in (ax.get_xticklabels(), ax.get_yticklabels()):
            for state, label in enumerate(labels):
                label.set_color(colour(state))  # each state's colour, as in the other two axes
        self._write_cells(model.transmat)

    def _write_cells(self, transmat: np.ndarray) -> None:
        for row, values in zip(self.cells, transmat):
            for cell, p in zip(row, values):
                cell.set_text(f"{p:.2f}")
                cell.set_color("white" if p > DARK_CELL else "black")

    # -- one sequence by its states ----------------------------------------------------------

    def _build_sequence(self, path: np.ndarray | None) -> None:
        ax = self.sequence_ax
        ax.set_title("a sequence, coloured by its Viterbi states", fontsize=10)
        ax.set_xlabel("time step", fontsize=9, labelpad=1)
        if self.sequence is None or path is None:
            ax.text(0.5, 0.5, NO_SEQUENCE, ha="center", va="center", transform=ax.transAxes)
            ax.set_xticks([])
            ax.set_yticks([])
            return
        t, values = np.arange(len(self.sequence)), drawn_values(self.sequence)
        ax.plot(t, values, color="#bdc3c7", lw=0.8)
        self.points = self.live.dynamic(ax.scatter(t, values, s=9, c=state_colours(path), linewidths=0))
        ax.set_xlim(-0.5, len(t) - 0.5)
        fit_limits(ax, values)


def state_colours(path: np.ndarray) -> list[str]:
    """Per time step, its state's colour."""
    return [colour(int(s)) for s in path]
