"""The teaching notebooks' concept diagrams: boxes and arrows drawn with matplotlib.

Each function draws one diagram and shows it inline. Every number a diagram states is an argument,
passed by the notebook cell that computed it.
"""
from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.patches import FancyBboxPatch

INK, BLUE, PALE, GREEN, RED, GREY, ORANGE, CREAM = (
    "#2c3e50", "#2980b9", "#eaf2f8", "#e8f6ef", "#c0392b", "#7f8c8d", "#e67e22", "#fdf2e9")
RANK_COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f")


class Board:
    """A blank canvas measured in inches, for boxes-and-arrows diagrams."""

    def __init__(self, width: float, height: float):
        self.fig = plt.figure(figsize=(width, height), dpi=80)
        self.ax = self.fig.add_axes((0, 0, 1, 1))
        self.ax.set_xlim(0, width)
        self.ax.set_ylim(0, height)
        self.ax.axis("off")

    def box(self, x, y, w, h, text, face=PALE, edge=INK, size=9, weight="normal"):
        self.ax.add_patch(FancyBboxPatch((x, y), w, h, boxstyle="round,pad=0.02,rounding_size=0.08",
                                         facecolor=face, edgecolor=edge, lw=1.2))
        self.ax.text(x + w / 2, y + h / 2, text, ha="center", va="center", fontsize=size,
                     weight=weight, color=INK)

    def frame(self, x, y, w, h, edge, face="none", lw=2.0):
        self.ax.add_patch(FancyBboxPatch((x, y), w, h, boxstyle="round,pad=0.01", facecolor=face,
                                         edgecolor=edge, lw=lw))

    def arrow(self, x0, y0, x1, y1, both=False, colour=INK):
        self.ax.annotate("", xy=(x1, y1), xytext=(x0, y0),
                         arrowprops={"arrowstyle": "<->" if both else "->", "color": colour, "lw": 1.3})

    def text(self, x, y, text, size=9, colour=INK, weight="normal", ha="left"):
        self.ax.text(x, y, text, fontsize=size, color=colour, weight=weight, ha=ha, va="center")

    def show(self) -> None:
        plt.show()


def _columns(world: int, width: float = 8.4) -> tuple[list[float], float]:
    """Left edges and width of one box per rank across the board."""
    gap = 0.4
    w = (width - gap * (world - 1)) / world
    return [0.3 + r * (w + gap) for r in range(world)], w


def cluster(world: int) -> None:
    """The notebook kernel, the ipyparallel controller, and ``world`` engines forming one group."""
    b = Board(9.0, 0.9 + 0.7 * world)
    middle = (0.9 + 0.7 * world) / 2
    b.box(0.1, middle - 0.45, 1.7, 0.9, "notebook kernel\n(you, this notebook)", face=GREEN)
    b.box(2.6, middle - 0.45, 1.7, 0.9, "ipyparallel\ncontroller")
    b.arrow(1.8, middle, 2.6, middle, both=True)
    b.text(1.85, middle + 0.25, "code,\nresults", size=8)
    tops = [0.5 + 0.7 * (world - 1 - r) for r in range(world)]
    for r, y in enumerate(tops):
        b.box(5.2, y, 1.6, 0.5, f"engine {r} = rank {r}", face="white", edge=RANK_COLOURS[r % 8])
        b.arrow(4.3, middle, 5.2, y + 0.25, colour=GREY)
    b.ax.plot([7.0, 7.15, 7.15, 7.0], [tops[0] + 0.25, tops[0] + 0.25, tops[-1] + 0.25, tops[-1] + 0.25],
              color=BLUE, lw=2)
    b.text(7.25, middle, "one torch.distributed\ngroup: all-reduce goes\nrank ↔ rank (gloo on\n"
           "loopback), never through\nthe controller", size=8, colour=BLUE)
    b.show()


def em_step(world: int, shard: int, numbers: int) -> None:
    """One distributed EM step: each rank's E-step, one all-reduce of ``numbers`` float64s, the M-step."""
    b = Board(9.0, 3.6)
    lefts, w = _columns(world)
    for r, x in enumerate(lefts):
        b.box(x, 2.75, w, 0.6, f"rank {r}: its {shard:,} points\n(resident, never sent)",
              face="white", edge=RANK_COLOURS[r % 8], size=8)
        b.arrow(x + w / 2, 2.75, x + w / 2, 2.45)
        b.box(x, 1.85, w, 0.6, f"E-step on the shard\n→ {numbers} numbers", size=8)
        b.arrow(x + w / 2, 1.85, x + w / 2, 1.55)
        b.arrow(x + w / 2, 1.1, x + w / 2, 0.8)
        b.box(x, 0.2, w, 0.6, "same M-step\n→ same model", face=GREEN, size=8)
    b.box(0.3, 1.1, 8.4, 0.45, f"all-reduce (sum): each rank sends its {numbers} float64 numbers "
          f"({numbers * 8} bytes) and receives the totals", face=CREAM, edge=ORANGE)
    b.show()


def ddp_step(world: int) -> None:
    """One DDP training step: per-rank gradients averaged by the all-reduce inside backward."""
    b = Board(9.0, 3.9)
    lefts, w = _columns(world)
    for r, x in enumerate(lefts):
        b.box(x, 3.05, w, 0.6, f"rank {r}: a batch from\nits own shard", face="white",
              edge=RANK_COLOURS[r % 8], size=8)
        b.arrow(x + w / 2, 3.05, x + w / 2, 2.75)
        b.box(x, 2.15, w, 0.6, "forward + backward\n→ its own gradient", size=8)
        b.arrow(x + w / 2, 2.15, x + w / 2, 1.85)
        b.arrow(x + w / 2, 1.4, x + w / 2, 1.1)
        b.box(x, 0.5, w, 0.6, "same averaged gradient\n→ same AdamW step", face=GREEN, size=8)
    b.box(0.3, 1.4, 8.4, 0.45, f"all-reduce inside backward: every rank ends with the mean of the "
          f"{world} gradients", face=CREAM, edge=ORANGE)
    b.text(0.3, 0.2, "The losses you see travel to the notebook through ipyparallel's data channel, "
           "not through the training group.", size=8, colour=GREY)
    b.show()


def token_shards(world: int, block: int) -> None:
    """The token ids cut into ``world`` contiguous shards, and one window of ``block`` targets."""
    b = Board(9.0, 1.9)
    b.text(0.1, 1.7, f"the token ids of the whole text, cut into {world} contiguous parts")
    w = 8.8 / world
    for r in range(world):
        b.box(0.1 + r * w, 1.0, w - 0.05, 0.45, f"rank {r}", face="white", edge=RANK_COLOURS[r % 8], size=8)
    b.frame(0.1 + 1.68 * w, 0.95, 0.6, 0.55, RED, lw=1.5)
    b.text(2.9, 0.6, f"one training window: {block} tokens, each predicted from those before it "
           f"({block} targets)", size=8, colour=RED)
    b.text(2.9, 0.3, f"windows start every {block} tokens (a random offset each epoch); cut on the fly, "
           "a batch at a time, in a shuffled order", size=8, colour=GREY)
    b.show()


def launchers() -> None:
    """The same handle code under the notebook's cluster and under torchrun."""
    b = Board(9.0, 3.4)
    b.text(0.1, 3.2, "in the notebook: %mixle_cluster start N", weight="bold")
    b.box(0.1, 2.2, 1.3, 0.6, "kernel", face=GREEN)
    b.box(1.8, 2.2, 1.3, 0.6, "controller")
    b.box(3.5, 2.2, 1.0, 0.6, "engines\n= ranks", face="white")
    b.arrow(1.4, 2.5, 1.8, 2.5, both=True)
    b.arrow(3.1, 2.5, 3.5, 2.5, both=True)
    b.text(0.1, 1.8, "MixleCluster forms the group; you drive it cell by cell", size=8, colour=GREY)
    b.text(4.9, 3.2, "in a terminal: torchrun --nproc_per_node N fit.py", weight="bold")
    b.box(4.9, 2.2, 1.3, 0.6, "torchrun", face=GREEN)
    b.box(6.7, 2.2, 2.1, 0.6, "N processes with RANK,\nWORLD_SIZE, MASTER_*", face="white", size=8)
    b.arrow(6.2, 2.5, 6.7, 2.5)
    b.text(4.9, 1.8, "the handle joins the group from those variables; runs to the end", size=8, colour=GREY)
    b.box(1.5, 0.3, 6.0, 0.8, "the same handle code on every rank:\nTorchRunEncodedData · "
          "StreamingTokenEncodedData · em_step · pysp_seq_estimate", face=CREAM, edge=ORANGE)
    b.arrow(4.0, 2.2, 3.5, 1.1)
    b.arrow(7.7, 2.2, 5.5, 1.1)
    b.show()


def network() -> None:
    """What a one-host and a several-host cluster expose on the network."""
    b = Board(9.0, 3.4)
    b.text(0.1, 3.2, "one host (the default)", weight="bold")
    b.frame(0.1, 0.5, 3.4, 2.4, GREEN)
    b.box(0.3, 2.1, 1.3, 0.5, "kernel", face=GREEN, size=8)
    b.box(1.9, 2.1, 1.4, 0.5, "controller", size=8)
    b.box(0.3, 1.3, 3.0, 0.5, "engines 0..N-1 (one torch.distributed group)", face="white", size=8)
    b.text(0.3, 0.85, "127.0.0.1 only · rendezvous: a file in a\nprivate temp dir · gloo pinned to loopback",
           size=8, colour=GREY)
    b.text(4.0, 3.2, "several hosts (launcher mpi / ssh / slurm)", weight="bold")
    b.box(4.0, 1.9, 1.9, 1.0, "host A\ncontroller\nengine 0 + TCPStore", size=8)
    b.box(7.0, 1.9, 1.9, 1.0, "host B\nengines 1..N-1", size=8)
    b.arrow(5.9, 2.55, 7.0, 2.55, both=True, colour=GREY)
    b.text(6.45, 2.72, "ZMQ", size=8, colour=GREY, ha="center")
    b.arrow(5.9, 2.2, 7.0, 2.2, both=True, colour=RED)
    b.text(6.45, 2.03, "TCPStore, gloo", size=8, colour=RED, ha="center")
    b.text(4.0, 1.35, "The controller's messages are signed with the cluster's key but not encrypted.", size=8)
    b.text(4.0, 1.0, "The TCPStore on engine 0 and the gloo links between ranks are", size=8, colour=RED)
    b.text(4.0, 0.75, "unauthenticated: whoever reaches those ports can join or disturb the group.",
           size=8, colour=RED)
    b.text(4.0, 0.4, "Use them only on a trusted, private network (firewalled cluster nodes).",
           size=8, colour=RED, weight="bold")
    b.show()
