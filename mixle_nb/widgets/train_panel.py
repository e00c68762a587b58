"""TrainPanel: streaming training across the ranks with a live loss plot (each rank faint, a
smoothed mean over ranks bold, held-out loss points, the entropy floor), drawn from what the
ranks publish (no extra collective), then text sampled from a prompt."""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Any

import ipywidgets as w

from .. import validation as check
from ..cluster import elastic as elastic_recovery
from ..cluster import rank_side
from ..cluster.local_ranks import LocalRanks
from .loss_view import LossView, mean_curve
from .panel import Panel, plot_image, resolve_cluster

if TYPE_CHECKING:
    from ..cluster import MixleCluster

PANEL_LEAF_NAME = "_mixle_panel_leaf"
# a local panel's objects, on its LocalRanks
LOCAL_HANDLE, LOCAL_ESTIMATOR, LOCAL_VALIDATION, LOCAL_STOP = "handle", "estimator", "validation", "stop"


class TrainPanel(Panel):
    """Train a ``StreamingTokenEncodedData`` handle with a live loss plot, then sample text.

    The plot shows each rank's loss faint, a smoothed mean over ranks bold, held-out loss
    points and the entropy floor, drawn from what the ranks publish (no extra collective).

    With a cluster, ``handle``, ``estimator`` and ``validation`` are names on the ranks;
    training runs in calls of ``chunk_steps`` optimizer steps, and Stop takes effect after the
    current chunk (Ctrl-C during a blocking :meth:`train` within one step). Without a cluster they
    are local objects, trained through the same rank functions on a one-rank
    ``LocalRanks`` (``mixle_nb.cluster.local_ranks``), in one call to the end of the epochs:
    the training loop there polls the Stop flag itself, so Stop takes effect after the current
    step.

    :meth:`train` and :meth:`stop` are the buttons' twins; after a ``restart()``, :meth:`attach`
    continues the curves on a new handle, and the training from the last weights the panel kept.

    Parameters
    ----------
    cluster : MixleCluster, optional
        The cluster whose ranks hold the handle. ``None``: the running cluster when ``handle`` is
        a name, else train locally.
    handle : str or StreamingTokenEncodedData
        The token handle (its name on the ranks with a cluster).
    estimator : str or StreamingTransformerLeafEstimator
        The estimator holding the module (its name on the ranks with a cluster).
    tokenizer : CharTokenizer, optional
        Decodes the sample generated from ``prompt`` after training (no sample without it).
    prompt : str, default ""
        The start of the sample.
    sample_chars : int, default 200
        The length of the sample.
    chunk_steps : int, default 20
        Optimizer steps per call on a cluster (Stop takes effect between calls).
    report_every : int, default 5
        Steps between the loss reports each rank publishes.
    temperature : float, default 0.8
        The sampling temperature (0: greedy).
    validation : str or StreamingTokenEncodedData, optional
        A token handle of held-out text: a held-out loss point after every call (every chunk;
        locally: at the end).
    entropy_floor : float, optional
        The source's entropy in nats, where it is known, drawn as the line no model can go below.
    x_axis : {"steps", "targets"}, default "steps"
        What the loss is plotted against (also a toggle).
    log_scale : bool, default False
        A logarithmic loss axis (also a checkbox).
    smoothing : float, default 0.8
        The exponential smoothing of the mean curve, in ``[0, 0.99]`` (0: none).
    fit_recent : bool, default False
        Fit the loss axis to the latest half of the steps (also a checkbox), so that the slow
        fall late in training is not squashed under the first steps' fast one.
    elastic : bool, default False
        On a cluster, with a handle built by ``from_file(..., checkpoint=DIR)``: when a rank dies
        mid-chunk, the survivors form a group of their own, each takes its slice of the token file
        for the new world size, and training goes on from the newest complete checkpoint. The
        curves are cut back to its step.

    Attributes
    ----------
    curves : dict
        Rank -> ``[(step, loss)]``, as drawn.
    points : dict
        Rank -> ``[(step, targets, loss)]``; targets count the tokens whose loss was taken.
    held_out : list
        ``[(step, targets, loss)]`` of the held-out evaluations.
    model_state : dict or None
        A ``state_dict`` of CPU tensors taken from rank 0 after every call.
    model_state_step : int
        The step ``model_state`` was taken at.
    sample_text : str
        The text generated after the last training.
    recoveries : list of RecoveryEvent
        The elastic recoveries so far.
    widget : ipywidgets.VBox
        What the notebook displays.

    Raises
    ------
    ValueError
        A bad number (``chunk_steps``, ``report_every``, ``sample_chars``, ``temperature``,
        ``smoothing``, ``entropy_floor``), an unknown ``x_axis``, ``elastic=True`` without a
        cluster, or a handle named on the ranks with no cluster running.
    TypeError
        Objects rather than names with a cluster.

    See Also
    --------
    mixle_nb.parallel.StreamingTokenEncodedData : The handle it trains.
    EMPanel : The panel for EM.

    Examples
    --------
    A local panel on a one-process handle:

    >>> from mixle_nb.neural import CharTokenizer, StreamingTransformerLeafEstimator, build_causal_lm
    >>> from mixle_nb.parallel import StreamingTokenEncodedData
    >>> from mixle_nb.widgets import TrainPanel
    >>> text = "the quick brown fox jumps over the lazy dog. " * 4
    >>> tok = CharTokenizer.fit(text)
    >>> lm = StreamingTransformerLeafEstimator(
    ...     build_causal_lm(tok.vocab_size, d_model=16, n_layer=1, n_head=2, block=8, seed=0), lr=1e-2
    ... )
    >>> th = StreamingTokenEncodedData(tok.encode(text), block=8, batch_size=4, init_process_group=False)
    >>> panel = TrainPanel(handle=th, estimator=lm, tokenizer=tok, prompt="the ", sample_chars=10)
    >>> panel.train()
    >>> rows = panel.history_rows()
    >>> rows[0]["kind"], rows[0]["rank"], rows[0]["step"]
    ('train', 0, 5)
    >>> len(panel.sample_text)
    14
    >>> th.close()
    """

    def __init__(
        self,
        cluster: MixleCluster | None = None,
        *,
        handle: Any,
        estimator: Any,
        tokenizer: Any = None,
        prompt: str = "",
        sample_chars: int = 200,
        chunk_steps: int = 20,
        report_every: int = 5,
        temperature: float = 0.8,
        validation: Any = None,
        entropy_floor: float | None = None,
        x_axis: str = "steps",
        log_scale: bool = False,
        smoothing: float = 0.8,
        fit_recent: bool = False,
        elastic: bool = False,
    ) -> None:
        super().__init__()
        self.chunk_steps = check.positive_int("chunk_steps", chunk_steps)
        self.report_every = check.positive_int("report_every", report_every)
        self.sample_chars = check.positive_int("sample_chars", sample_chars)
        self.temperature = check.real("temperature", temperature, at_least=0.0)
        self.smoothing = check.real("smoothing", smoothing, at_least=0.0, at_most=0.99)
        self.entropy_floor = None if entropy_floor is None else check.positive_real("entropy_floor", entropy_floor)
        check.choice("x_axis", x_axis, ("steps", "targets"))
        self.tokenizer, self.prompt = tokenizer, prompt
        self.curves: dict[int, list] = {}
        self.points: dict[int, list] = {}
        self.held_out: list = []
        self.updates = 0  # progress reports received, all ranks together
        self.sample_text = ""
        self.model_state: dict | None = None
        self.model_state_step = 0
        self.elastic = bool(elastic)
        self.recoveries: list = []
        self._offset = (0, 0)  # (steps, targets) trained on earlier handles, before attach()
        self._stop = threading.Event()
        self._rates: dict[int, float] = {}
        self._started = 0.0
        self._bind(cluster, handle, estimator, validation)
        self._build(x_axis, bool(log_scale), bool(fit_recent))
        self.redraw()

    def _bind(self, cluster: MixleCluster | None, handle: Any, estimator: Any, validation: Any) -> None:
        """Take the handle, estimator and held-out handle: names on ``cluster``'s ranks, or
        local objects, bound under names of their own on a :class:`LocalRanks` with the Stop
        flag, its published progress drawn as it comes; both train through the same rank
        functions (cluster/rank_side.py)."""
        self.cluster = resolve_cluster(cluster, handle, estimator)
        if self.cluster is None:
            if self.elastic:
                raise ValueError("elastic=True needs a cluster: it lets training go on when one of its ranks dies")
            self.ranks = LocalRanks(on_data=self._record)
            self.ranks.push(
                **{
                    LOCAL_HANDLE: handle,
                    LOCAL_ESTIMATOR: estimator,
                    LOCAL_VALIDATION: validation,
                    LOCAL_STOP: self._stop,
                }
            )
            handle, estimator = LOCAL_HANDLE, LOCAL_ESTIMATOR
            validation = None if validation is None else LOCAL_VALIDATION
            self._chunk_steps: int | None = None  # one call; its loop sees Stop
            self._stop_name: str | None = LOCAL_STOP
        else:
            if validation is not None and not isinstance(validation, str):
                raise TypeError("with a cluster, pass validation= as the name the held-out handle has on the ranks")
            self.ranks = self.cluster
            self._chunk_steps, self._stop_name = self.chunk_steps, None
        self.handle, self.estimator, self.validation = handle, estimator, validation
        if self.elastic:
            self.ranks.run(rank_side.check_elastic_on_rank, handle, True)

    def train(self, block: bool = True) -> None:
        """Train to the end of the handle's epochs, or until :meth:`stop`.

        Parameters
        ----------
        block : bool, default True
            Wait for the training to end; ``False`` returns at once, as the Train button does.

        Raises
        ------
        RuntimeError
            Training is already running.
        """
        if self.running:
            raise RuntimeError("training is already running: stop() it or wait() for it first")
        self._stop.clear()
        self._start_worker(self._guarded_train)
        if block:
            self.wait()

    def stop(self) -> None:
        """Stop after the current step (locally) or chunk (on a cluster)."""
        self._stop.set()

    def attach(
        self, cluster: MixleCluster | None = None, *, handle: Any, estimator: Any, validation: Any = None
    ) -> None:
        """Continue on a new handle (after ``restart()`` and a rebuild), keeping the curves.

        The new handle's steps and targets are counted on from the last ones seen, and the kept
        weights (``model_state``) are loaded into the new estimator's module before training
        continues. After a rank died mid-chunk those are the weights of the last finished chunk;
        the optimizer's moments start afresh. A handle with a complete checkpoint (``checkpoint=``)
        resumes from it instead, module, optimizer and data position together: the curves are
        cut back to its step, and continue from there as the lost steps did.

        Parameters
        ----------
        cluster : MixleCluster, optional
            As for the constructor.
        handle : str or StreamingTokenEncodedData
            The new token handle (its name on the ranks with a cluster).
        estimator : str or StreamingTransformerLeafEstimator
            The estimator (its name on the ranks with a cluster).
        validation : str or StreamingTokenEncodedData, optional
            The held-out handle.

        Raises
        ------
        RuntimeError
            Training is running.
        """
        if self.running:
            raise RuntimeError("training is running: stop() it or wait() for it first")
        last = [pts[-1] for pts in self.points.values() if pts]
        self._offset = (max((p[0] for p in last), default=0), max((p[1] for p in last), default=0))
        self._bind(cluster, handle, estimator, validation)
        weights = ""
        resume = self._checkpoint_step()
        if resume is not None:
            self._cut_back(resume)
            weights = f" from the checkpoint of step {resume} (module, optimizer, data position)"
        elif self.model_state is not None:
            self.ranks.run(rank_side.load_module_state_on_rank, self.estimator, self.model_state)
            weights = f" with the weights of step {self.model_state_step}"
        self.error = None
        start = self._offset[0] if resume is None else resume
        self._show_status(f"attached to {handle!r}; continuing from step {start}{weights}")

    def _checkpoint_step(self) -> int | None:
        """The step of the handle's newest complete checkpoint, where its training resumes."""
        return self.ranks.run(rank_side.checkpoint_step_on_rank, self.handle, targets=[0])[0]

    def _cut_back(self, step: int) -> None:
        """Drop what was drawn after ``step``; the resumed handle counts steps and targets on
        from its checkpoint, so no offset is added."""
        for points in (*self.points.values(), *self.curves.values()):
            points[:] = [p for p in points if p[0] <= step]
        self.held_out[:] = [p for p in self.held_out if p[0] <= step]
        self._offset = (0, 0)

    def history_rows(self) -> list[dict]:
        """The history as rows: each progress report, held-out evaluation and recovery.

        Returns
        -------
        list of dict
            ``kind`` (``"train"`` per rank, ``"held-out"``, ``"recovery"``), ``rank``, ``step``,
            ``targets`` and ``loss``; a recovery's row also has ``recovery`` (its description).
        """
        rows = [
            {"kind": "train", "rank": rank, "step": s, "targets": t, "loss": loss}
            for rank, pts in sorted(self.points.items())
            for s, t, loss in list(pts)
        ]
        rows += [
            {"kind": "held-out", "rank": "all", "step": s, "targets": t, "loss": loss}
            for s, t, loss in list(self.held_out)
        ]
        rows += [
            {
                "kind": "recovery",
                "rank": sum(e.lost, []),
                "step": e.at_step,
                "targets": None,
                "loss": None,
                "recovery": e.describe(),
            }
            for e in self.recoveries
        ]
        return rows

    def _request_stop(self) -> None:
        self._stop.set()

    # -- work --------------------------------------------------------------------------------

    def _guarded_train(self) -> None:
        self.error = None
        self._started = time.monotonic()
        try:
            self._train()
            self._show_sample()
        except BaseException as exc:
            self.error = exc
            first = (str(exc).strip().splitlines() or [""])[0]
            if self._interrupted.is_set():
                self._show_status("training interrupted; the curves so far are kept", error=True)
            else:
                self._show_status(f"{type(exc).__name__}: {first}", error=True)
        self.request_redraw()

    def _train(self) -> None:
        """Calls of :func:`~mixle_nb.cluster.rank_side.train_on_rank` until the handle's epochs
        are done or Stop; after each, the weights are kept and the held-out loss is taken."""
        done = self.ranks.run(rank_side.training_progress_on_rank, self.handle, targets=[0])[0]
        steps_done, total = done["steps_done"], done["total_steps"]
        self.progress.max = self._offset[0] + total
        while steps_done < total and not self._stop.is_set():
            call = self.ranks.run_async(
                rank_side.train_on_rank,
                self.handle,
                self.estimator,
                PANEL_LEAF_NAME,
                self._chunk_steps,
                self.report_every,
                self._stop_name,
            )
            try:
                results = self._await(call, on_slice=lambda: self._record(call.data))  # noqa: B023
            except elastic_recovery.RankDiedError as exc:
                if not self.elastic:
                    raise
                steps_done, total = self._go_on(exc, call)
                continue
            self._record(call.data)
            self._record({r: res["last_report"] for r, res in zip(call.ranks, results) if res["last_report"]})
            steps_done = results[0]["steps_done"]
            self.model_state, self.model_state_step = results[0]["state"], self._offset[0] + steps_done
            if self.validation is not None:
                loss = self.ranks.run(rank_side.held_out_loss_on_rank, self.validation, PANEL_LEAF_NAME)[0]
                self._add_held_out(loss)

    def _go_on(self, exc: elastic_recovery.RankDiedError, call: Any) -> tuple[int, int]:
        """Elastic: the survivors of ``call`` (a cluster's ``RankCall``) form a group, take their new slices of the token
        file and resume from the newest checkpoint; the event is recorded, the curves cut back
        to its step. The handle's (steps done, total steps) at the new world size."""
        last = [pts[-1][0] for pts in self.points.values() if pts]
        event = elastic_recovery.recover(
            self.cluster, self.handle, exc.ranks, [call], at_step=max(last, default=self._offset[0])
        )
        event.resumed_from = resumed = self._checkpoint_step()
        if resumed is None:  # elastic handles are built with checkpoint=DIR; none complete yet
            raise RuntimeError("a rank died before the first complete checkpoint: nothing to resume training from")
        offset = self._offset
        self._cut_back(offset[0] + resumed)
        self._offset = offset  # the same handle counts on from its checkpoint
        self.recoveries.append(event)
        self._show_status(event.describe())
        done = self.cluster.run(rank_side.training_progress_on_rank, self.handle, targets=[0])[0]
        self.progress.max = self._offset[0] + done["total_steps"]
        return done["steps_done"], done["total_steps"]

    def _add_held_out(self, loss: float) -> None:
        last = [pts[-1] for pts in self.points.values() if pts]
        step = max((p[0] for p in last), default=self._offset[0])
        targets = max((p[1] for p in last), default=self._offset[1])
        self.held_out.append((step, targets, float(loss)))
        self.request_redraw()

    def _record(self, reports: dict) -> None:
        """Append new points per rank; ask for a redraw (throttled)."""
        steps0, targets0 = self._offset
        for rank, report in reports.items():
            points = self.points.setdefault(rank, [])
            step = steps0 + report["step"]
            if not points or step > points[-1][0]:
                targets = targets0 + report["targets"]
                points.append((step, targets, report["loss"]))
                self.curves.setdefault(rank, []).append((step, report["loss"]))
                self.updates += 1
                self._rates[rank] = report.get("targets_per_s", 0.0)
        self.request_redraw()

    def _show_sample(self) -> None:
        if self.tokenizer is None or not self.prompt:
            return
        ids = self.tokenizer.encode(self.prompt)
        out = self.ranks.run(
            rank_side.generate_on_rank, PANEL_LEAF_NAME, ids, self.sample_chars, self.temperature, 0, targets=[0]
        )[0]
        self.sample_text = self.tokenizer.decode(out)  # the prompt followed by the sample
        self.sample.value = self.sample_text

    # -- view --------------------------------------------------------------------------------

    def _build(self, x_axis: str, log_scale: bool, fit_recent: bool) -> None:
        self.train_button = w.Button(description="Train")
        self.stop_button = w.Button(description="Stop")
        self.train_button.on_click(lambda _: self.train(block=False) if not self.running else None)
        self.stop_button.on_click(lambda _: self.stop())
        self.log_scale = w.Checkbox(
            value=log_scale, description="log scale", indent=False, layout=w.Layout(width="90px")
        )
        self.fit_recent = w.Checkbox(
            value=fit_recent, description="fit recent half", indent=False, layout=w.Layout(width="120px")
        )
        self.x_axis = w.ToggleButtons(options=["steps", "targets"], value=x_axis, style={"button_width": "70px"})
        self.log_scale.observe(lambda _: self._new_view(), "value")
        self.x_axis.observe(lambda _: self._new_view(), "value")
        self.fit_recent.observe(lambda _: self._new_view(), "value")
        self.progress = w.IntProgress(value=0, min=0, max=1, description="steps")
        self.status = w.HTML()
        self.image = plot_image()
        self.sample = w.Textarea(
            value="",
            placeholder="generated text appears here after training",
            layout=w.Layout(width="95%", height="90px"),
        )
        self.view = self._make_view()
        self.widget = w.VBox(
            [
                w.HBox([self.train_button, self.stop_button, self.progress, self.status]),
                w.HBox([self.x_axis, self.log_scale, self.fit_recent]),
                self.image,
                self.sample,
            ]
        )
        self.widget.add_class("mixle-train-panel")

    def _make_view(self) -> LossView:
        return LossView(
            self.x_axis.value, self.log_scale.value, self.entropy_floor, self.smoothing, self.fit_recent.value
        )

    def _new_view(self) -> None:
        with self._redraw_lock:
            self.view = self._make_view()
        self.request_redraw()

    def _render(self) -> bytes:
        points = {r: list(p) for r, p in self.points.items()}
        png = self.view.render(points, list(self.held_out))
        mean = mean_curve(self.curves)
        step = max((pts[-1][0] for pts in points.values() if pts), default=0)
        self.progress.value = min(step, self.progress.max)
        if self.error is None and step:
            rate = sum(self._rates.values())
            elapsed = time.monotonic() - self._started
            done = step - self._offset[0]
            left = elapsed / done * max(self.progress.max - step, 0) if self.running and done > 0 else 0.0
            loss = f" · mean loss {mean[-1][1]:.3f}" if mean else ""
            held = f" · held-out {self.held_out[-1][2]:.3f}" if self.held_out else ""
            self._show_status(
                f"step {step}/{self.progress.max}{loss}{held} · {rate:,.0f} targets/s · {left:.0f} s left"
            )
        return png
