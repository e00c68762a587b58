"""EMPanel's model choice: the start from the data (Init, ``initialize``) and the choice of K
(Choose K, ``choose_k``: BIC and AIC against K), both run where the data live (rank_side)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import ipywidgets as w

from .. import validation
from ..cluster import rank_side
from ..inference import INITS
from ..stats.estimation import EMStep
from .em_view import EMView, choose_k_png
from .hmm_picture import is_hmm
from .panel import Panel, plot_image


class ModelChoice(Panel):
    """Init and Choose K, a part of :class:`~.em_panel.EMPanel`, which provides the ranks and
    names, the state and the view declared below; :class:`~.panel.Panel` gives the worker and
    the status."""

    ranks: Any  # a MixleCluster or LocalRanks
    handle: str
    estimator: str
    model_name: str
    model: Any  # the current model (EMPanel's property)
    _scored_on: str | None  # what Choose K fits: the handle, or locally the data sample's name
    _lock: threading.Lock
    history: list[EMStep]
    start_model: Any
    k_choice: dict | None
    k_image: w.Image | None
    buttons: dict[str, w.Button]
    _save_checkpoint: Callable[..., None]
    _new_view: Callable[[], EMView]
    _guarded: Callable[[Callable[[], Any]], None]
    _in_background: Callable[[Callable[[], Any]], None]

    def initialize(self, init: str = "kmeans++", seed: int = 0) -> None:
        """Start again from the model ``init`` finds in the data, clearing the history.

        Parameters
        ----------
        init : {"kmeans++", "random_from_data", "random"}, default "kmeans++"
            k-means++ (run as k-means‖ where the data live), K observations as centres, or random
            responsibilities.
        seed : int, default 0
            The seed of ``init``.

        Raises
        ------
        RuntimeError
            A run is going.
        ValueError
            An unknown ``init`` or a negative ``seed``.
        """
        if self.running:
            raise RuntimeError("a run is going: pause() it or wait() for it first")
        self._reinitialize(init, seed)

    def _reinitialize(self, init: str, seed: int) -> None:
        with self._lock:
            self.start_model = self._initial_model(init, seed)
            self.history.clear()
            self.error = None
            self._save_checkpoint(force=True)
        self.view = self._new_view()
        self.request_redraw()

    def _initial_model(self, init: str, seed: int) -> Any:
        init = validation.choice("init", init, INITS)
        seed = validation.integer("seed", seed, minimum=0)
        call = self.ranks.run_async(
            rank_side.initial_model_on_rank, self.handle, self.estimator, self.model_name, init, seed
        )
        return self._await(call)[0]

    def choose_k(self, k_max: int, init: str = "kmeans++", seed: int = 0, block: bool = True) -> None:
        """Fit K = 1..``k_max`` components and plot BIC and AIC against K.

        The components are copies of the estimator's first component, fitted on the cluster
        (locally: on ``data_sample``). The result is kept in ``k_choice``: ``k``, ``bic``, ``aic``,
        ``models`` and ``best_k``.

        Parameters
        ----------
        k_max : int
            The largest K tried.
        init : {"kmeans++", "random_from_data", "random"}, default "kmeans++"
            How each fit starts.
        seed : int, default 0
            The seed of ``init``.
        block : bool, default True
            Wait for the fits; ``False`` returns at once, as the Choose K button does.

        Raises
        ------
        ValueError
            A bad ``k_max`` or ``init``.
        RuntimeError
            A run is going.

        Examples
        --------
        >>> import numpy as np
        >>> from mixle_nb.stats import GaussianEstimator, MixtureEstimator
        >>> from mixle_nb.widgets import EMPanel
        >>> rng = np.random.default_rng(0)
        >>> x = np.concatenate([rng.normal(-4, 1, 150), rng.normal(4, 1, 150)])
        >>> panel = EMPanel(handle=x, estimator=MixtureEstimator([GaussianEstimator()] * 2), init="kmeans++")
        >>> panel.choose_k(3)
        >>> panel.k_choice["best_k"]
        2
        """
        k_max = validation.positive_int("k_max", k_max)
        init = validation.choice("init", init, INITS)
        if self.running:
            raise RuntimeError("a run is going: pause() it or wait() for it first")
        self._start_worker(self._guarded, lambda: self._choose_k(list(range(1, k_max + 1)), init, seed))
        if block:
            self.wait()
            if self.error is not None:
                raise self.error

    def _choose_k(self, k_values: list, init: str, seed: int) -> None:
        self.error = None
        self._show_status(f"choosing K: fitting K = 1..{k_values[-1]} ...")
        try:
            if self._scored_on is None:
                raise ValueError("choosing K locally needs the raw data: pass data_sample=")
            call = self.ranks.run_async(
                rank_side.choose_k_on_rank, self._scored_on, self.estimator, k_values, init, seed
            )
            found = self._await(call)[0]
        except BaseException as exc:
            self.error = exc
            self._show_status(
                f"choose K failed: {type(exc).__name__}: {(str(exc).splitlines() or [''])[0]}", error=True
            )
            raise
        self.k_choice = found
        if self.k_image is None:
            self.k_image = plot_image()
            self.widget.children = (*self.widget.children, self.k_image)
        parts = "states" if is_hmm(self.model) else "components"
        self.k_image.value = choose_k_png(found["k"], found["bic"], found["aic"], found["best_k"], parts)
        self.request_redraw()

    def _selection_controls(self, init: str, seed: int) -> w.HBox:
        """Init (a start from the data) and Choose K (BIC against K), as an optional row."""
        self.init_choice = w.Dropdown(
            options=list(INITS),
            value=init,
            description="init",
            layout=w.Layout(width="210px"),
            style={"description_width": "initial"},
        )
        self.k_max = w.BoundedIntText(
            value=6,
            min=1,
            max=50,
            description="K max",
            style={"description_width": "initial"},
            layout=w.Layout(width="110px"),
        )
        self.buttons["Init"] = w.Button(description="Init")
        self.buttons["Choose K"] = w.Button(description="Choose K")
        self.buttons["Init"].on_click(
            lambda _: self._guarded(
                lambda: self._in_background(lambda: self._reinitialize(self.init_choice.value, seed))
            )
        )
        self.buttons["Choose K"].on_click(
            lambda _: self._guarded(lambda: self.choose_k(self.k_max.value, self.init_choice.value, seed, block=False))
        )
        return w.HBox([self.init_choice, self.buttons["Init"], self.k_max, self.buttons["Choose K"]])
