"""What the live panels share: finding the cluster, one background worker that Ctrl-C stops,
calls on the ranks that an interrupt cancels, throttled redraws, the status line and the
history as rows."""

from __future__ import annotations

import csv
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import ipywidgets as w

from .. import cluster as cluster_module
from ..cluster.calls import result_unless_interrupted

if TYPE_CHECKING:
    import os

    from IPython.display import Image

REDRAW_INTERVAL_S = 0.2  # at most 5 redraws a second (the issue allows 10): the ranks keep the cores
REDRAW_CPU_SHARE = 0.1  # and, within that, at most this share of one core: a redraw whose limits
# changed draws axes and text again (100-200 ms), which early in a run happens at nearly every redraw
REDRAW_MAX_INTERVAL_S = 0.5  # but at least 2 redraws a second while there is something new to show
WAIT_SLICE_S = 0.1  # how often a blocked wait() wakes: Python runs a Ctrl-C's handler only when the
# main thread runs, and a SIGINT the kernel delivers to another thread does not wake a lock wait
STOP_DEADLINE_S = 30.0  # how long Ctrl-C waits for the worker (a cancel may re-form the group)


def resolve_cluster(cluster: Any, handle: Any, estimator: Any) -> Any:
    """The cluster to run on (given, else the running one when objects are named), or ``None``
    to run locally; names and objects must not be mixed up."""
    if cluster is None and isinstance(handle, str):
        cluster = cluster_module.current()
        if cluster is None:
            raise ValueError(
                f"handle {handle!r} is a name on the ranks, but no cluster is running: "
                "start one with %mixle_cluster start N, or pass the objects themselves"
            )
    if cluster is not None and not (isinstance(handle, str) and isinstance(estimator, str)):
        raise TypeError("with a cluster, pass handle= and estimator= as the names they have on the ranks")
    return cluster


def plot_image() -> w.Image:
    """An image shown at its rendered size (never stretched soft), shrinking to fit narrow views."""
    return w.Image(format="png", layout=w.Layout(align_self="flex-start", max_width="100%", height="auto"))


class Panel:
    """A widget with one background worker (so clicks never block the kernel), a status line
    and a plot image redrawn at most every :data:`REDRAW_INTERVAL_S` (less often when redraws
    are costly, to take at most :data:`REDRAW_CPU_SHARE` of a core, but at least every
    :data:`REDRAW_MAX_INTERVAL_S`) from a timer thread, so neither the kernel nor the worker
    waits on drawing."""

    widget: w.VBox  # built by subclasses
    image: w.Image
    status: w.HTML

    def __init__(self) -> None:
        self._worker: threading.Thread | None = None
        self.error: BaseException | None = None
        self.redraws = 0  # images sent to the front end
        self._interrupted = threading.Event()
        self._done = threading.Event()  # set when the worker's target returns
        self._redraw_lock = threading.Lock()  # one render at a time
        self._timer_lock = threading.Lock()
        self._timer: threading.Timer | None = None
        self._dirty = False  # a redraw was requested since the timer's last one began
        self._last_draw = 0.0
        self._last_draw_cpu = 0.0  # CPU seconds the last redraw took

    # -- the worker --------------------------------------------------------------------------

    @property
    def running(self) -> bool:
        """Whether background work (a run, training, Choose K) is going."""
        return self._worker is not None and not self._done.is_set()

    def wait(self, timeout: float | None = None) -> None:
        """Block until the background work ends, or for ``timeout`` seconds.

        Ctrl-C here stops the worker and the ranks it is waiting on, then raises
        ``KeyboardInterrupt``.

        Parameters
        ----------
        timeout : float, optional
            The most seconds to wait (default: however long it takes).
        """
        if self._worker is None:
            return
        # an Event, not Thread.join: a join interrupted by Ctrl-C can report a live thread as ended
        try:
            finished = self._wait_done(timeout)
        except KeyboardInterrupt:
            self._interrupted.set()
            self._request_stop()
            if self._done.wait(STOP_DEADLINE_S):
                self.flush()
            else:
                self._show_status(
                    f"interrupted, but the worker is still waiting on the ranks after "
                    f"{STOP_DEADLINE_S:g} s: see the cluster's status",
                    error=True,
                )
            raise
        if finished:
            self.flush()

    def _wait_done(self, timeout: float | None) -> bool:
        """Whether the worker ended within ``timeout`` s (``None``: however long), waited for in
        slices of :data:`WAIT_SLICE_S` so that a pending Ctrl-C is raised within one slice."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = WAIT_SLICE_S if deadline is None else min(WAIT_SLICE_S, deadline - time.monotonic())
            if left <= 0:
                return self._done.is_set()
            if self._done.wait(left):
                return True

    def _request_stop(self) -> None:
        """Ask the worker to stop before its next step (subclasses set their flag)."""

    def _start_worker(self, target: Callable, *args: Any) -> None:
        self._interrupted.clear()
        self._done.clear()

        def work() -> None:
            try:
                target(*args)
            finally:
                self._done.set()

        self._worker = threading.Thread(target=work, daemon=True)
        self._worker.start()

    def _await(self, call: Any, on_slice: Callable[[], None] = lambda: None) -> list:
        """The per-rank results of a RankCall, waited for in slices: between them ``on_slice``
        runs and an interrupt cancels the call on every rank (its result then raises)."""
        return result_unless_interrupted(call, self._interrupted, on_slice)

    # -- drawing -----------------------------------------------------------------------------

    def request_redraw(self) -> None:
        """Redraw soon, without blocking.

        Never more often than every ``REDRAW_INTERVAL_S`` nor so often that redraws take more than
        ``REDRAW_CPU_SHARE`` of a core (up to ``REDRAW_MAX_INTERVAL_S``). One timer at a time:
        requests while it waits or draws are folded into it or the next one.
        """
        with self._timer_lock:
            self._dirty = True
            if self._timer is None:
                self._schedule()

    def _schedule(self) -> None:
        interval = min(max(REDRAW_INTERVAL_S, self._last_draw_cpu / REDRAW_CPU_SHARE), REDRAW_MAX_INTERVAL_S)
        delay = max(0.0, self._last_draw + interval - time.monotonic())
        timer = threading.Timer(delay, lambda: self._timed_redraw(timer))
        timer.daemon = True
        self._timer = timer
        timer.start()

    def _timed_redraw(self, timer: threading.Timer) -> None:
        with self._timer_lock:
            self._dirty = False
        self.redraw()
        with self._timer_lock:
            if self._timer is timer:
                self._timer = None
                if self._dirty:
                    self._schedule()

    def flush(self) -> None:
        """Draw the current state now (after a blocking call, so a saved notebook keeps it)."""
        with self._timer_lock:
            if self._timer is not None:
                self._timer.cancel()  # a timer already drawing finishes; one still waiting never will
                self._timer = None
            self._dirty = False
        self.redraw()

    def redraw(self) -> None:
        """Render the plot now, in this thread, and send it to the front end."""
        with self._redraw_lock:
            self._last_draw = time.monotonic()  # from the start: requests meanwhile wait a full interval
            cpu = time.thread_time()
            self.image.value = self._render()
            self._last_draw_cpu = time.thread_time() - cpu
            self.redraws += 1

    def _render(self) -> bytes:
        raise NotImplementedError

    def _show_status(self, text: str, error: bool = False) -> None:
        colour = "#c0392b" if error else "#2c3e50"
        self.status.value = f"<span style='color:{colour}'>{text}</span>"

    # -- history -----------------------------------------------------------------------------

    def history_rows(self) -> list[dict]:
        raise NotImplementedError

    def to_csv(self, path: str | os.PathLike) -> None:
        """Write :meth:`history_rows` as CSV, one column per key in first-seen order.

        Parameters
        ----------
        path : str or os.PathLike
            The file to write (replaced if it exists).
        """
        rows = self.history_rows()
        columns = list(dict.fromkeys(key for row in rows for key in row))
        with open(path, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=columns)
            writer.writeheader()
            writer.writerows(rows)

    def snapshot(self) -> Image:
        """The current plot as a static image, for reports and exported HTML.

        Returns
        -------
        IPython.display.Image
            The last rendered PNG.
        """
        from IPython.display import Image

        return Image(data=self.image.value, format="png")

    def _repr_mimebundle_(self, **kwargs: Any) -> Any:
        return self.widget._repr_mimebundle_(**kwargs)
