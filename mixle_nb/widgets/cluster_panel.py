"""ClusterPanel: the cluster's status table with a Refresh button."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import ipywidgets as w

if TYPE_CHECKING:
    from ..cluster import MixleCluster


class ClusterPanel:
    """The cluster's status table (one row per rank) with a Refresh button.

    Parameters
    ----------
    cluster : MixleCluster
        The cluster whose ``status()`` is shown.

    Attributes
    ----------
    table : ipywidgets.HTML
        The status table.
    widget : ipywidgets.VBox
        What the notebook displays: the button above the table.

    See Also
    --------
    mixle_nb.cluster.MixleCluster.status : The table's rows.

    Examples
    --------
    Before :meth:`~mixle_nb.cluster.MixleCluster.start` the table has no rows; Refresh
    after it shows one per rank (starting engines is skipped here):

    >>> from mixle_nb.cluster import MixleCluster
    >>> from mixle_nb.widgets import ClusterPanel
    >>> cluster = MixleCluster(4)
    >>> panel = ClusterPanel(cluster)
    >>> panel.table.value.count("<tr>")
    1
    >>> cluster.start()  # doctest: +SKIP
    >>> panel.refresh()  # doctest: +SKIP
    >>> panel.table.value.count("<tr>")  # doctest: +SKIP
    5
    """

    def __init__(self, cluster: MixleCluster) -> None:
        self.cluster = cluster
        self.table = w.HTML()
        self.refresh_button = w.Button(description="Refresh")
        self.refresh_button.on_click(lambda _: self.refresh())
        self.widget = w.VBox([self.refresh_button, self.table])
        self.widget.add_class("mixle-cluster-panel")
        self.refresh()

    def refresh(self) -> None:
        """Read ``cluster.status()`` again and show it."""
        self.table.value = self.cluster.status()._repr_html_()

    def _repr_mimebundle_(self, **kwargs: Any) -> Any:  # displays as its widget
        return self.widget._repr_mimebundle_(**kwargs)
