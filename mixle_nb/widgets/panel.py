"""What the live panels share: finding the cluster, one background worker, the status line."""
from __future__ import annotations

import threading
from typing import Callable, Optional

import ipywidgets as w

from .. import cluster as cluster_module


def resolve_cluster(cluster, handle, estimator):
    """The cluster to run on (given, else the running one when objects are named), or ``None``
    to run locally; names and objects must not be mixed up."""
    if cluster is None and isinstance(handle, str):
        cluster = cluster_module.current()
        if cluster is None:
            raise ValueError(f"handle {handle!r} is a name on the ranks, but no cluster is running: "
                             "start one with %mixle_cluster start N, or pass the objects themselves")
    if cluster is not None and not (isinstance(handle, str) and isinstance(estimator, str)):
        raise TypeError("with a cluster, pass handle= and estimator= as the names they have on the ranks")
    return cluster


def plot_image():
    """An image shown at its rendered size (never stretched soft), shrinking to fit narrow views."""
    return w.Image(format="png", layout=w.Layout(align_self="flex-start", max_width="100%", height="auto"))


class Panel:
    """A widget with one background worker (so clicks never block the kernel) and a status line."""

    widget = image = status = None  # built by subclasses

    def __init__(self):
        self._worker: Optional[threading.Thread] = None
        self.error: Optional[BaseException] = None

    @property
    def running(self) -> bool:
        return self._worker is not None and self._worker.is_alive()

    def wait(self, timeout: Optional[float] = None) -> None:
        """Block until the background work ends."""
        if self._worker is not None:
            self._worker.join(timeout)

    def _start_worker(self, target: Callable, *args) -> None:
        self._worker = threading.Thread(target=target, args=args, daemon=True)
        self._worker.start()

    def _show_status(self, text: str, error: bool = False) -> None:
        colour = "#c0392b" if error else "#2c3e50"
        self.status.value = f"<span style='color:{colour}'>{text}</span>"

    def snapshot(self):
        """The current plot as a static image, for reports and exported HTML."""
        from IPython.display import Image

        return Image(data=self.image.value, format="png")

    def _repr_mimebundle_(self, **kwargs):
        return self.widget._repr_mimebundle_(**kwargs)
