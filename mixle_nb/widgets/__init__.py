"""Live notebook panels: EMPanel, TrainPanel and ClusterPanel."""

from .cluster_panel import ClusterPanel
from .em_panel import EMPanel
from .train_panel import TrainPanel

__all__ = ["ClusterPanel", "EMPanel", "TrainPanel"]
