"""EMPanel: step EM interactively on a handle living on the ranks (or locally), plotting the
log-density per step (all-reduced across ranks) and its gain on a log scale, the model against
the data, and per-rank E-step times."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import ipywidgets as w
import numpy as np
from numpy.typing import ArrayLike

from .. import validation
from ..checkpoint import EMCheckpoint
from ..cluster import elastic as elastic_recovery
from ..cluster import rank_side
from ..cluster.local_ranks import LocalRanks
from ..cluster.step_calls import BATCH_SECONDS, StepCalls
from ..inference import INITS
from ..stats.estimation import EMStep, seq_encode
from ..stats.hmm import HiddenMarkovEstimator
from .em_model_choice import ModelChoice
from .em_view import EMView
from .panel import Panel, plot_image, resolve_cluster

if TYPE_CHECKING:
    import os

    from ..cluster import MixleCluster

PANEL_MODEL_NAME = "_mixle_panel_model"
LOCAL_HANDLE, LOCAL_ESTIMATOR, LOCAL_DATA = "handle", "estimator", "data"  # a local panel's, on its LocalRanks
DATA_SAMPLE_SIZE = 2000
AXES_AHEAD_S = 2.0  # during a run the step axes also hold the steps this much of it will bring
TIMED_STEPS = 20  # the E-step bars' axis fits this many steps' times: it does not follow each one's noise


class EMPanel(ModelChoice, Panel):
    """Step EM interactively and watch it: the log-density, the model against the data, per-rank times.

    The panel steps a handle either on a cluster's ranks or locally. With a cluster,
    ``handle``/``estimator``/``model`` are the names those objects have on the ranks: ``model``
    names the current model there, and each step replaces it (a model object is pushed under a
    private name instead). Without a cluster (none given and none running) they are local
    objects: ``handle`` may then be the raw data (an array or a list of observations, encoded
    here) or data encoded already; they are stepped through the same rank functions, on a
    one-rank ``LocalRanks`` (``mixle_nb.cluster.local_ranks``) (one step a call). Models may be
    ours or the mixle package's.

    Buttons and their programmatic twins: Step :meth:`step`, Run N :meth:`run`, Pause
    :meth:`pause`, Back :meth:`back`, Reset :meth:`reset`. ``history`` keeps every step; a failed
    step (a rank's error, a dead rank, Ctrl-C) leaves it and the current model untouched. After a
    ``restart()``, :meth:`attach` continues on the new handle from the last good model.

    On a cluster, :meth:`run` sends calls that each run several steps on the ranks, sized from
    the measured step time so that one call lasts about ``batch_seconds``, and keeps the next
    call queued behind the running one, so the ranks never wait on the client's round trip.
    Pause therefore stops after the calls already sent (at most two); Ctrl-C still stops within
    one step; a call failing part way keeps the steps it completed, and the call queued behind
    it runs none.

    Parameters
    ----------
    cluster : MixleCluster, optional
        The cluster whose ranks hold the handle. ``None``: the running cluster when ``handle`` is
        a name, else run locally.
    handle : str or object
        With a cluster, the name of the handle on the ranks; locally, the handle itself, data
        encoded already, or the raw observations (an array or a list, encoded here).
    estimator : str or object
        The estimator (its name on the ranks with a cluster).
    model : str or object, optional
        The start model, or its name on the ranks (then each step replaces it there). Give
        exactly one of ``model`` and ``init``.
    data_sample : array_like, optional
        The observations drawn in the picture (default: up to 2000 evenly spaced ones taken from
        rank 0's shard, or from the raw data).
    picture_dims : sequence of int, optional
        The two dimensions drawn for D > 2 Gaussians (default: the data sample's first two
        principal components).
    init : {"kmeans++", "random_from_data", "random"}, optional
        Find the start model in the data instead: ``"kmeans++"`` runs k-means‖ where the data
        live, then a labelled M-step; ``"random_from_data"`` takes K observations as centres;
        ``"random"`` draws random responsibilities.
    seed : int, default 0
        The seed of ``init``.
    model_selection : bool, default False
        ``model_selection=True`` adds a row with an Init menu (start again from the data) and
        Choose K (fit K = 1..K max copies of the estimator's first component, plot BIC and AIC
        against K; ``choose_k`` is its twin).
    batch_seconds : float, default 0.2
        On a cluster, about how long one call of :meth:`run` lasts (0: one step a call, none
        queued).
    checkpoint : str or os.PathLike or EMCheckpoint, optional
        A file keeping the start model and the history, replaced atomically every step (or
        every ``EMCheckpoint.every``) and after Back, Reset and Init; a panel built with an
        existing file continues from it (a new kernel after the old one died), pushing its model
        to the ranks.
    elastic : bool, default False
        On a cluster, with a handle built ``elastic=True`` from files: when a rank dies during
        :meth:`run`, the survivors take over its shards and the run goes on, the model bit for bit
        that of a run without the failure; ``recoveries`` lists each
        ``RecoveryEvent`` (``mixle_nb.cluster.elastic``) and the step taken again after one
        carries it (``history_rows()``' ``recovery``).

    Attributes
    ----------
    history : list of EMStep
        Every step taken, oldest first.
    model : object
        The current model: the last step's, or the start.
    start_model : object
        The model the first step starts from.
    k_choice : dict or None
        After Choose K: ``k``, ``bic``, ``aic``, ``models`` and ``best_k``.
    recoveries : list of RecoveryEvent
        The elastic recoveries so far.
    error : BaseException or None
        The last failure shown, ``None`` after a good step.
    widget : ipywidgets.VBox
        What the notebook displays.

    Raises
    ------
    ValueError
        Neither or both of ``model`` and ``init``; ``elastic=True`` without a cluster; a bad
        ``batch_seconds``; a handle named on the ranks with no cluster running.
    TypeError
        Objects rather than names with a cluster.

    See Also
    --------
    mixle_nb.inference.fit : The same EM run to convergence without a panel.
    TrainPanel : The panel for streaming training.

    Examples
    --------
    A local panel on raw data (with a cluster, pass the names the handle and estimator have on
    the ranks instead):

    >>> import numpy as np
    >>> from mixle_nb.stats import GaussianEstimator, MixtureEstimator
    >>> from mixle_nb.widgets import EMPanel
    >>> x = np.random.default_rng(0).normal(size=200)
    >>> estimator = MixtureEstimator([GaussianEstimator()] * 2)
    >>> panel = EMPanel(handle=x, estimator=estimator, init="kmeans++", seed=0)
    >>> panel.step().step
    1
    >>> panel.run(4)
    >>> len(panel.history)
    5
    >>> panel.back(2)
    >>> len(panel.history)
    3
    """

    def __init__(
        self,
        cluster: MixleCluster | None = None,
        *,
        handle: Any,
        estimator: Any,
        model: Any = None,
        data_sample: ArrayLike | None = None,
        picture_dims: Sequence[int] | None = None,
        init: str | None = None,
        seed: int = 0,
        model_selection: bool = False,
        batch_seconds: float = BATCH_SECONDS,
        checkpoint: str | os.PathLike | EMCheckpoint | None = None,
        elastic: bool = False,
    ) -> None:
        super().__init__()
        self.elastic = bool(elastic)
        self.recoveries: list = []
        self._pending_recovery: elastic_recovery.RecoveryEvent | None = None
        self.batch_seconds = validation.real("batch_seconds", batch_seconds, at_least=0.0)
        self.history: list[EMStep] = []
        self._lock = threading.Lock()
        self._pause = threading.Event()
        self._run_end: int | None = None  # the step a run in progress ends at
        self._axis_reach = 0  # the steps the step axes hold during that run (only grows)
        self.picture_dims = picture_dims
        self.k_choice: dict | None = None
        if (model is None) == (init is None):
            raise ValueError(
                "give the start as model= (a model, or its name on the ranks) or as init= "
                f"(one of {', '.join(INITS)}), not both and not neither"
            )
        self._bind(cluster, handle, estimator, model, data_sample)
        if self.elastic:
            if self.cluster is None:
                raise ValueError("elastic=True needs a cluster: it lets a run go on when one of its ranks dies")
            self.cluster.run(rank_side.check_elastic_on_rank, handle)  # on every rank: all fail together
        self.checkpoint = EMCheckpoint.of(checkpoint)
        saved = self.checkpoint.load("panel") if self.checkpoint else None
        self.start_model = self._current_model
        if saved:
            self.start_model, self.history = saved["start_model"], saved["history"]
            self._push_current()
        elif init is not None:
            self.start_model = self._initial_model(init, seed)
        self._build(model_selection, init or "kmeans++", seed)
        self.redraw()

    def _bind(
        self, cluster: MixleCluster | None, handle: Any, estimator: Any, model: Any, data_sample: ArrayLike | None
    ) -> None:
        """Take the handle, estimator and model to step with: names on ``cluster``'s ranks, or
        local objects, bound under names of their own on a :class:`LocalRanks`, so both run
        the same rank functions (cluster/rank_side.py)."""
        self.cluster = resolve_cluster(cluster, handle, estimator)
        sequences = isinstance(estimator, HiddenMarkovEstimator)  # an HMM's observations are sequences
        raw_sequences = None
        if self.cluster is None:
            if isinstance(handle, (np.ndarray, list, tuple)):  # raw data: encode it here
                if sequences:  # drawn: the first sequence (data_sample_on_rank); Choose K: them all
                    raw_sequences = handle
                elif data_sample is None:
                    data_sample = _evenly_spaced(handle, DATA_SAMPLE_SIZE)
                handle = seq_encode(handle, model=model, estimator=estimator)
            self.ranks = LocalRanks()
            self.ranks.push(**{LOCAL_HANDLE: handle, LOCAL_ESTIMATOR: estimator})
            handle, estimator = LOCAL_HANDLE, LOCAL_ESTIMATOR
        else:
            self.ranks = self.cluster
        self.handle, self.estimator = handle, estimator
        if model is None:
            self.model_name, self._current_model = PANEL_MODEL_NAME, None
        elif isinstance(model, str):
            self.model_name, self._current_model = model, self.ranks.pull(model)
        else:
            self.model_name, self._current_model = PANEL_MODEL_NAME, model
            self.ranks.push(**{PANEL_MODEL_NAME: model})
        # locally one step a call: each runs in this process's worker, which stops between calls
        self.calls = StepCalls(
            self.ranks,
            handle,
            estimator,
            self.model_name,
            self.batch_seconds if self.cluster is not None else 0.0,
            self._interrupted,
        )
        if data_sample is None:
            data_sample = self.ranks.run(rank_side.data_sample_on_rank, handle, DATA_SAMPLE_SIZE, targets=[0])[0]
        self.data_sample = None if data_sample is None else np.asarray(data_sample)
        # what Choose K fits and scores: the handle; locally the raw data sample (inference.choose_k
        # encodes what it is given, so it cannot take a local encoding)
        self._scored_on = handle
        if self.cluster is None:
            scored: Any = self.data_sample if not sequences or self.data_sample is None else [self.data_sample]
            scored = scored if raw_sequences is None else raw_sequences
            self._scored_on = None if scored is None else LOCAL_DATA
            self.ranks.push(**{LOCAL_DATA: scored})

    # -- state -------------------------------------------------------------------------------

    @property
    def step_calls(self) -> int:
        """Calls of steps sent to the ranks since the handle was bound (a call may hold several steps)."""
        return self.calls.sent

    @property
    def model(self) -> Any:
        """The current model: the last step's, or the start."""
        return self.history[-1].model if self.history else self.start_model

    def history_rows(self) -> list[dict]:
        """The history as rows, one dict per step.

        Returns
        -------
        list of dict
            Per step: ``step``, ``log_density`` (of the model the step started from), ``gain`` over
            the previous step (NaN for the first), ``count`` (observations), ``e_step_s_rank<r>``
            (each rank's E-step seconds), ``model`` (its repr) and ``recovery`` (the elastic recovery
            the step followed, described, or ``None``).

        Examples
        --------
        >>> import numpy as np
        >>> from mixle_nb.stats import GaussianEstimator, MixtureEstimator
        >>> from mixle_nb.widgets import EMPanel
        >>> x = np.random.default_rng(0).normal(size=100)
        >>> panel = EMPanel(handle=x, estimator=MixtureEstimator([GaussianEstimator()] * 2), init="kmeans++")
        >>> _ = panel.step()
        >>> sorted(panel.history_rows()[0])
        ['count', 'e_step_s_rank0', 'gain', 'log_density', 'model', 'recovery', 'step']
        """
        rows, previous = [], None
        for r in list(self.history):
            row: dict[str, Any] = {
                "step": r.step,
                "log_density": r.log_density,
                "gain": float("nan") if previous is None else r.log_density - previous,
                "count": r.count,
            }
            row.update({f"e_step_s_rank{i}": s for i, s in enumerate(r.rank_seconds)})
            row["model"] = repr(r.model)
            row["recovery"] = None if r.recovery is None else r.recovery.describe()
            rows.append(row)
            previous = r.log_density
        return rows

    # -- the programmatic twins of the buttons ----------------------------------------------

    def step(self) -> EMStep:
        """Take one EM step on every rank, blocking until it is recorded.

        Returns
        -------
        EMStep
            The step: its number, the model it produced, the log-density of the model it started
            from, the count and the per-rank E-step times.

        Raises
        ------
        RankError
            A rank's step failed (the history and the model stay as they were).
        NameError
            The handle is missing on the ranks (after a restart): the message says how to rebuild it
            and :meth:`attach`.
        """
        self._interrupted.clear()
        with self._lock:
            self.calls.send(1)
            record = self._collect()[0]
        self.request_redraw()
        return record

    def run(self, n: int, block: bool = True) -> None:
        """Take ``n`` steps, in the background or blocking.

        ``pause()`` stops the run after the calls already sent (on a cluster: at most two, of about
        ``batch_seconds`` each; locally: one step). Ctrl-C during a blocking run stops it within one
        step.

        Parameters
        ----------
        n : int
            The number of steps, at least 1.
        block : bool, default True
            Wait for the run to end; ``False`` returns at once, as the Run N button does.

        Raises
        ------
        ValueError
            ``n`` is not a positive integer.
        RuntimeError
            A run is already going.
        """
        n = validation.positive_int("run(n)", n)
        if self.running:
            raise RuntimeError("a run is already going: pause() it or wait() for it first")
        self._pause.clear()
        self._start_worker(self._run_loop, n)
        if block:
            self.wait()

    def pause(self) -> None:
        """Stop a run after the calls already sent (on a cluster at most two, see ``batch_seconds``)."""
        self._pause.set()

    def back(self, k: int = 1) -> None:
        """Rewind ``k`` steps, dropping them from ``history``, and push that model to the ranks.

        Parameters
        ----------
        k : int, default 1
            How many steps to go back, from 1 to ``len(history)``.

        Raises
        ------
        ValueError
            ``k`` is not in ``1..len(history)``.
        """
        k = validation.positive_int("back(k)", k)
        if k > len(self.history):
            raise ValueError(f"can go back 1..{len(self.history)} steps; got {k!r}")
        with self._lock:
            del self.history[len(self.history) - k :]
            self._push_current()
            self._save_checkpoint(force=True)
        self.request_redraw()

    def reset(self) -> None:
        """Forget every step and push the start model to the ranks."""
        with self._lock:
            self.history.clear()
            self._push_current()
            self._save_checkpoint(force=True)
        self.request_redraw()

    def attach(
        self,
        cluster: MixleCluster | None = None,
        *,
        handle: Any,
        estimator: Any,
        data_sample: ArrayLike | None = None,
    ) -> None:
        """Continue on a new handle, keeping the history.

        After ``cluster.restart()``, a re-push and a rebuild of the handle, the last good model is
        pushed to the new ranks and stepping goes on from it.

        Parameters
        ----------
        cluster : MixleCluster, optional
            As for the constructor.
        handle : str or object
            The new handle (its name on the ranks with a cluster).
        estimator : str or object
            The estimator (its name on the ranks with a cluster).
        data_sample : array_like, optional
            The observations drawn in the picture (default: the panel's current sample).

        Raises
        ------
        RuntimeError
            A run is going.
        """
        if self.running:
            raise RuntimeError("a run is going: pause() it or wait() for it first")
        with self._lock:
            model = self.model
            self._bind(cluster, handle, estimator, model, data_sample if data_sample is not None else self.data_sample)
            self.error = None
        self._show_status(f"attached to {handle!r}; continuing from step {len(self.history)}")
        self.view = self._new_view()
        self.flush()

    def _request_stop(self) -> None:
        self._pause.set()

    # -- work --------------------------------------------------------------------------------

    def _collect(self) -> list[EMStep]:
        """Record the steps of the oldest call sent (the caller holds the lock). If it failed,
        the steps it completed are recorded, the failure shown and raised."""
        try:
            steps = self.calls.collect()
        except BaseException as exc:
            self._record(self.calls.completed())
            explained = self._explained(exc)
            self._fail(explained)
            if explained is not exc:
                raise explained from exc
            raise
        records = self._record(steps)
        self.error = None
        return records

    def _record(self, steps: list[EMStep]) -> list[EMStep]:
        """Append ``steps``, numbered on from the history; the first after an elastic recovery carries it."""
        for i, step in enumerate(steps):
            step.step = len(self.history) + 1 + i
        if steps and self._pending_recovery is not None:
            steps[0].recovery, self._pending_recovery = self._pending_recovery, None
        self.history.extend(steps)
        self._save_checkpoint(before=len(self.history) - len(steps))
        return steps

    def _save_checkpoint(self, before: int | None = None, force: bool = False) -> None:
        if self.checkpoint and (force or self.checkpoint.due(len(self.history), before)):
            self.checkpoint.save("panel", {"start_model": self.start_model, "history": list(self.history)})

    def _explained(self, exc: BaseException) -> BaseException:
        """``exc``, or for a handle missing on the ranks (a restart leaves them empty) an error
        that says to build it there again and attach: a handle cannot be pushed."""
        if getattr(exc, "ename", None) == "NameError" and f"{self.handle!r} is not defined" in str(exc):
            return NameError(
                f"{self.handle!r} is not defined on rank {getattr(exc, 'rank', '?')} (a restart leaves the ranks "
                "empty): build it on the ranks again (the %%mixle cell that made it, after "
                f"pushing what it needs), then panel.attach(handle={self.handle!r}, "
                f"estimator={self.estimator!r})"
            )
        return exc

    def _fail(self, exc: BaseException) -> None:
        """Show the failure (first line: which rank, what error), keep the last good model."""
        self.error = exc
        step = len(self.history) + 1
        if self._interrupted.is_set():
            text = f"step {step} interrupted; the model of step {step - 1} is kept"
        else:
            first = (str(exc).strip().splitlines() or [""])[0]
            text = f"step {step} failed: {type(exc).__name__}: {first}"
            if isinstance(exc, elastic_recovery.RankDiedError):
                text += (
                    " · after restart(), re-push and rebuild the handle, then panel.attach(handle=..., "
                    "estimator=...) continues from the last good model"
                )
        self._show_status(text, error=True)
        self._restore_ranks()

    def _run_loop(self, n: int) -> None:
        self.progress.max, self.progress.value = n, 0
        self._axis_reach, self._run_end = len(self.history), len(self.history) + n
        try:
            self._run_calls(n)
        finally:
            self._run_end = None
        self.request_redraw()

    def _axis_steps(self, taken: int) -> int:
        """The steps the step axes hold: those ``taken``, and during a run also those the next
        :data:`AXES_AHEAD_S` of it will bring (up to its end), so that a run widens the axes
        once or twice rather than at every doubling, and they fit the steps taken once it ends
        (or pauses)."""
        end, step_s = self._run_end, self.calls.step_s
        if end is None or not step_s:
            return taken
        self._axis_reach = max(self._axis_reach, min(end, taken + int(AXES_AHEAD_S / step_s)))
        return max(taken, self._axis_reach)

    def _run_calls(self, n: int) -> None:
        """Send the run's steps in calls with one queued behind the running one (StepCalls), so
        the ranks go from call to call without waiting on the round trip; record each as it returns."""
        sent = 0
        while True:
            collecting = False
            try:
                sent += self.calls.fill(n - sent, self._pause.is_set)
                if not self.calls.queue:
                    return
                collecting = True
                with self._lock:
                    records = self._collect()
            except BaseException as exc:
                recorded = self._went_on(exc)
                if recorded is None and not collecting:  # sending failed (a rank died between calls)
                    if self._collect_sent():
                        self._fail(exc)
                    return
                if recorded is None:
                    return  # _collect has recorded what completed, shown the error, kept the last good model
                self.progress.value += recorded
                sent = self.progress.value
                continue
            if not records:  # the ranks ran nothing (a call behind an interrupted one): stop
                self._pause.set()
            self.progress.value += len(records)
            self.request_redraw()

    def _collect_sent(self) -> bool:
        """Record the steps of the calls already sent; False if one failed (it shows its own
        error, as :meth:`_collect` does)."""
        while self.calls.queue:
            try:
                with self._lock:
                    self.progress.value += len(self._collect())
            except BaseException:
                return False
        return True

    def _went_on(self, exc: BaseException) -> int | None:
        """Elastic: after a rank died, the survivors take over its shards, the steps the failed
        calls completed are recorded and the run goes on; how many steps were recorded.
        ``None``: not elastic, not a dead rank, or the recovery failed (shown)."""
        if not self.elastic or not isinstance(exc, elastic_recovery.RankDiedError):
            return None
        calls = self.calls.abandon()
        try:
            with self._lock:
                event = elastic_recovery.recover(self.cluster, self.handle, exc.ranks, [c.call for c in calls])
                records = self._record(
                    elastic_recovery.completed_on_survivors(self.cluster, [c.call_id for c in calls])
                )
                event.at_step = len(self.history) + 1
                self._push_current()
        except BaseException as failure:
            self._fail(failure)
            return None
        self.recoveries.append(event)
        self._pending_recovery = event
        self._show_status(event.describe())
        return len(records)

    def _push_current(self) -> None:
        self.ranks.push(**{self.model_name: self.model})

    def _restore_ranks(self) -> None:
        """After a failed step, put the last good model back on every rank that can take it."""
        try:
            self._push_current()
        except Exception:  # a dead rank: the error already shown says to restart()
            pass

    # -- view --------------------------------------------------------------------------------

    def _build(self, model_selection: bool, init: str, seed: int) -> None:
        self.buttons = {name: w.Button(description=name) for name in ("Step", "Run N", "Pause", "Back", "Reset")}
        self.n_steps = w.BoundedIntText(
            value=10,
            min=1,
            max=100_000,
            description="N",
            style={"description_width": "initial"},
            layout=w.Layout(width="110px"),
        )
        self.progress = w.IntProgress(value=0, min=0, max=1, description="run")
        self.status = w.HTML()
        self.image = plot_image()
        self.view = self._new_view()
        actions = {
            "Step": lambda: self._in_background(self.step),
            "Run N": lambda: self.run(self.n_steps.value, block=False),
            "Pause": self.pause,
            "Back": lambda: self.back(1) if self.history else None,
            "Reset": self.reset,
        }
        for name, button in self.buttons.items():
            button.on_click(lambda _, act=actions[name]: self._guarded(act))
        controls = w.HBox(
            [
                self.buttons["Step"],
                self.n_steps,
                self.buttons["Run N"],
                self.buttons["Pause"],
                self.buttons["Back"],
                self.buttons["Reset"],
            ]
        )
        rows = [controls, w.HBox([self.progress, self.status]), self.image]
        self.k_image = None  # added below the plot by the first choice of K
        if model_selection:
            rows.insert(1, self._selection_controls(init, seed))
        self.widget = w.VBox(rows)
        self.widget.add_class("mixle-em-panel")

    def _new_view(self) -> EMView:
        return EMView(self.model, self.data_sample, self.cluster is not None, self.picture_dims)

    def _in_background(self, action: Callable[[], object]) -> None:
        if not self.running:
            self._start_worker(self._guarded, action)

    def _guarded(self, action: Callable[[], object]) -> None:
        try:
            action()
        except BaseException as exc:  # a click must never raise into the kernel's comm handler
            if self.error is not exc:  # a failed step has shown itself already
                self._show_status(f"{type(exc).__name__}: {exc}", error=True)

    def _render(self) -> bytes:
        history = list(self.history)
        png = self.view.render(
            [r.log_density for r in history],
            self.model,
            history[-1].rank_seconds if history else [],
            self._axis_steps(len(history)),
            [r.rank_seconds for r in history[-TIMED_STEPS:-1]],
        )
        if self.error is None:
            last = f" · log-density {history[-1].log_density:.6g}" if history else ""
            stopped = " · interrupted (Ctrl-C): run stopped" if self._interrupted.is_set() else ""
            k = self.k_choice
            chosen = f" · BIC chooses K = {k['best_k']} (of 1..{k['k'][-1]})" if k else ""
            self._show_status(f"step {len(history)}{last}{stopped}{chosen}")
        return png


def _evenly_spaced(data: Any, n: int) -> np.ndarray:
    """Up to ``n`` evenly spaced observations of ``data``, for drawing."""
    x = np.asarray(data)
    return x[np.linspace(0, len(x) - 1, min(n, len(x))).astype(int)] if len(x) else x
