"""ClusterPanel: the cluster's status table with a Refresh button."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import ipywidgets as w

if TYPE_CHECKING:
    from ..cluster import MixleCluster


class ClusterPanel:
    """Shows ``cluster.status()`` (one row per rank) and refreshes it on demand."""

    def __init__(self, cluster: MixleCluster) -> None:
        self.cluster = cluster
        self.table = w.HTML()
        self.refresh_button = w.Button(description="Refresh")
        self.refresh_button.on_click(lambda _: self.refresh())
        self.widget = w.VBox([self.refresh_button, self.table])
        self.widget.add_class("mixle-cluster-panel")
        self.refresh()

    def refresh(self) -> None:
        self.table.value = self.cluster.status()._repr_html_()

    def _repr_mimebundle_(self, **kwargs: Any) -> Any:  # displays as its widget
        return self.widget._repr_mimebundle_(**kwargs)
