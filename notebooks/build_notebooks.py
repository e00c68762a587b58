"""Build the four teaching notebooks, outputs stripped, from this one reviewable script.

    python notebooks/build_notebooks.py             # writes notebooks/0*.ipynb
    python notebooks/build_notebooks.py --out DIR   # writes them to DIR instead

Every code cell comes right after a markdown cell that says what it shows. Concept diagrams
(drawn here with matplotlib) travel inside their markdown cells as attachments, so the
notebooks stay self-contained and carry no outputs. Cells tagged ``summary`` are the ones
whose printed text ``make demo`` copies into its console summary.
"""
from __future__ import annotations

import argparse
import base64
import io
import textwrap
from pathlib import Path

import nbformat
from matplotlib.figure import Figure
from matplotlib.patches import FancyBboxPatch

HERE = Path(__file__).resolve().parent
KERNELSPEC = {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"}

INK, BLUE, PALE, GREEN, RED, GREY = "#2c3e50", "#2980b9", "#eaf2f8", "#e8f6ef", "#c0392b", "#7f8c8d"
RANK_COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728")


# ---------------------------------------------------------------- diagrams


class Board:
    """A blank canvas measured in inches, for boxes-and-arrows diagrams."""

    def __init__(self, width: float, height: float):
        self.fig = Figure(figsize=(width, height))
        self.ax = self.fig.add_axes((0, 0, 1, 1))
        self.ax.set_xlim(0, width)
        self.ax.set_ylim(0, height)
        self.ax.axis("off")

    def box(self, x, y, w, h, text, face=PALE, edge=INK, size=9, weight="normal", colour=INK):
        self.ax.add_patch(FancyBboxPatch((x, y), w, h, boxstyle="round,pad=0.02,rounding_size=0.08",
                                         facecolor=face, edgecolor=edge, lw=1.2))
        self.ax.text(x + w / 2, y + h / 2, text, ha="center", va="center", fontsize=size,
                     weight=weight, color=colour)

    def arrow(self, x0, y0, x1, y1, text=None, both=False, colour=INK, size=8, offset=(0.05, 0.05)):
        self.ax.annotate("", xy=(x1, y1), xytext=(x0, y0),
                         arrowprops={"arrowstyle": "<->" if both else "->", "color": colour, "lw": 1.3})
        if text:
            self.ax.text((x0 + x1) / 2 + offset[0], (y0 + y1) / 2 + offset[1], text, fontsize=size,
                         color=colour)

    def text(self, x, y, text, size=9, colour=INK, weight="normal", ha="left", va="center"):
        self.ax.text(x, y, text, fontsize=size, color=colour, weight=weight, ha=ha, va=va)

    def png(self) -> str:
        buffer = io.BytesIO()
        self.fig.savefig(buffer, format="png", dpi=80, metadata={"Software": None})
        return base64.b64encode(buffer.getvalue()).decode("ascii")


def cluster_diagram() -> str:
    b = Board(9.0, 3.0)
    b.box(0.1, 1.1, 1.7, 0.9, "notebook kernel\n(you, this notebook)", face=GREEN)
    b.box(2.6, 1.1, 1.7, 0.9, "ipyparallel\ncontroller")
    b.arrow(1.8, 1.55, 2.6, 1.55, both=True)
    b.text(1.85, 1.8, "code,\nresults", size=8)
    for r in range(4):
        y = 2.35 - r * 0.7
        b.box(5.2, y, 1.6, 0.5, f"engine {r} = rank {r}", face="white", edge=RANK_COLOURS[r])
        b.arrow(4.3, 1.55, 5.2, y + 0.25, colour=GREY)
    b.ax.plot([7.0, 7.15, 7.15, 7.0], [2.6, 2.6, 0.5, 0.5], color=BLUE, lw=2)
    b.text(7.25, 1.55, "one torch.distributed\ngroup: all-reduce goes\nrank ↔ rank (gloo on\nloopback), never through\nthe controller", size=8, colour=BLUE)
    return b.png()


def em_step_diagram() -> str:
    b = Board(9.0, 3.6)
    for r in range(4):
        x = 0.3 + r * 2.2
        b.box(x, 2.75, 1.8, 0.6, f"rank {r}: its 50,000 points\n(resident, never sent)",
              face="white", edge=RANK_COLOURS[r], size=8)
        b.arrow(x + 0.9, 2.75, x + 0.9, 2.45)
        b.box(x, 1.85, 1.8, 0.6, "E-step on the shard\n→ 18 sums", size=8)
        b.arrow(x + 0.9, 1.85, x + 0.9, 1.55)
        b.arrow(x + 0.9, 1.1, x + 0.9, 0.8)
        b.box(x, 0.2, 1.8, 0.6, "same M-step\n→ same model", face=GREEN, size=8)
    b.box(0.3, 1.1, 8.4, 0.45, "all-reduce (sum): each rank sends its 18 float64 sums (144 bytes) "
          "and receives the totals", face="#fdf2e9", edge="#e67e22", size=9)
    return b.png()


def ddp_diagram() -> str:
    b = Board(9.0, 3.9)
    for r in range(4):
        x = 0.3 + r * 2.2
        b.box(x, 3.05, 1.8, 0.6, f"rank {r}: a batch from\nits own shard", face="white",
              edge=RANK_COLOURS[r], size=8)
        b.arrow(x + 0.9, 3.05, x + 0.9, 2.75)
        b.box(x, 2.15, 1.8, 0.6, "forward + backward\n→ its own gradient", size=8)
        b.arrow(x + 0.9, 2.15, x + 0.9, 1.85)
        b.arrow(x + 0.9, 1.4, x + 0.9, 1.1)
        b.box(x, 0.5, 1.8, 0.6, "same averaged gradient\n→ same AdamW step", face=GREEN, size=8)
    b.box(0.3, 1.4, 8.4, 0.45, "all-reduce inside backward: every rank ends with the mean of the 4 gradients",
          face="#fdf2e9", edge="#e67e22", size=9)
    b.text(0.3, 0.2, "The losses you see travel to the notebook through ipyparallel's data channel, "
           "not through the training group.", size=8, colour=GREY)
    return b.png()


def shards_diagram() -> str:
    b = Board(9.0, 1.9)
    b.text(0.1, 1.7, "the token ids of the whole text, cut into 4 contiguous quarters", size=9)
    for r in range(4):
        b.box(0.1 + r * 2.2, 1.0, 2.15, 0.45, f"rank {r}", face="white", edge=RANK_COLOURS[r], size=8)
    b.ax.add_patch(FancyBboxPatch((3.74, 0.95), 0.55, 0.55, boxstyle="round,pad=0.01", fill=False,
                                  edgecolor=RED, lw=1.5))
    b.ax.add_patch(FancyBboxPatch((4.32, 0.95), 0.07, 0.55, boxstyle="round,pad=0.01", facecolor=RED,
                                  edgecolor=RED, lw=1.5))
    b.text(2.9, 0.6, "one training window: 32 characters of context → the character that follows",
           size=8, colour=RED)
    b.text(2.9, 0.3, "windows are cut on the fly, a batch at a time, in a shuffled order", size=8,
           colour=GREY)
    return b.png()


def launchers_diagram() -> str:
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
    b.text(4.9, 1.8, "the handle joins the group from those variables; runs to the end", size=8,
           colour=GREY)
    b.box(1.5, 0.3, 6.0, 0.8, "the same handle code on every rank:\nTorchRunEncodedData · "
          "StreamingTokenEncodedData · em_step · pysp_seq_estimate", face="#fdf2e9", edge="#e67e22")
    b.arrow(4.0, 2.2, 3.5, 1.1)
    b.arrow(7.7, 2.2, 5.5, 1.1)
    return b.png()


def network_diagram() -> str:
    b = Board(9.0, 3.4)
    b.text(0.1, 3.2, "one host (the default)", weight="bold")
    b.ax.add_patch(FancyBboxPatch((0.1, 0.5), 3.4, 2.4, boxstyle="round,pad=0.02", fill=False,
                                  edgecolor=GREEN, lw=2))
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
    b.text(4.0, 1.35, "The controller's messages are signed with the cluster's key but not encrypted.",
           size=8, colour=INK)
    b.text(4.0, 1.0, "The TCPStore on engine 0 and the gloo links between ranks are", size=8, colour=RED)
    b.text(4.0, 0.75, "unauthenticated: whoever reaches those ports can join or disturb the group.",
           size=8, colour=RED)
    b.text(4.0, 0.4, "Use them only on a trusted, private network (firewalled cluster nodes).",
           size=8, colour=RED, weight="bold")
    return b.png()


# ---------------------------------------------------------------- cells


class Notebook:
    """Collects cells; code cells must follow a markdown cell (the prose rule)."""

    def __init__(self, slug: str):
        self.slug, self.cells = slug, []

    def md(self, text: str, **pictures: str) -> Notebook:
        cell = nbformat.v4.new_markdown_cell(textwrap.dedent(text).strip())
        if pictures:
            cell.attachments = {f"{name}.png": {"image/png": data} for name, data in pictures.items()}
        return self._add(cell)

    def code(self, source: str, tags: tuple = ()) -> Notebook:
        if not self.cells or self.cells[-1].cell_type != "markdown":
            raise ValueError(f"{self.slug}: a code cell must follow a markdown cell saying what it shows")
        cell = nbformat.v4.new_code_cell(textwrap.dedent(source).strip())
        if tags:
            cell.metadata["tags"] = list(tags)
        return self._add(cell)

    def _add(self, cell) -> Notebook:
        cell.id = f"{self.slug}-{len(self.cells):02d}"  # stable ids: rebuilding changes nothing
        self.cells.append(cell)
        return self

    def build(self) -> nbformat.NotebookNode:
        nb = nbformat.v4.new_notebook(cells=self.cells)
        nb.metadata = {"kernelspec": dict(KERNELSPEC), "language_info": {"name": "python"}}
        nbformat.validate(nb)
        return nb


def em_by_hand() -> nbformat.NotebookNode:
    nb = Notebook("em-by-hand")
    nb.md("""
        # 01 · EM by hand: a 1-D Gaussian mixture

        Expectation–maximisation (EM) fits a mixture model by repeating two steps. In this notebook
        everything runs in this one process, and we compute each step twice: by hand with numpy,
        and with `mixle_nb.stats`. You will see

        1. what the **E-step** computes (responsibilities),
        2. the **sufficient statistics** it sums up,
        3. what the **M-step** computes from them,
        4. why the log-density of the data **never decreases**,
        5. the `EMPanel`, which steps a fit and redraws the density after each step.
        """)
    nb.md("""
        The next cell imports numpy, matplotlib and the EM core. It also keeps torch (which the
        EM core uses for its array maths) on one thread, so timings stay steady on a small machine.
        """)
    nb.code("""
        import matplotlib.pyplot as plt
        import numpy as np
        import torch

        from mixle_nb.stats import GaussianDistribution, MixtureDistribution, em_step, seq_encode
        from mixle_nb.stats.values import flatten_value
        from mixle_nb.widgets import EMPanel

        torch.set_num_threads(1)
        """)
    nb.md("""
        ## The data

        We draw 20,000 points from a mixture of three Gaussians whose parameters we know, so we
        can check later what EM finds. The histogram shows three bumps of different width and height.
        """)
    nb.code("""
        truth = MixtureDistribution([GaussianDistribution(-2.5, 0.6), GaussianDistribution(0.5, 1.0),
                                     GaussianDistribution(3.5, 0.4)], w=[0.3, 0.45, 0.25])
        x = truth.sampler(seed=0).sample(20_000)

        fig, ax = plt.subplots(figsize=(8, 2.8))
        ax.hist(x, bins=120, density=True, color="#c8d3e0")
        ax.set(title="20,000 points from a mixture of three Gaussians", xlabel="x", ylabel="density")
        plt.show()
        """)
    nb.md("""
        ## The model and a starting guess

        A mixture of K Gaussians has density p(x) = Σₖ wₖ · N(x | μₖ, σₖ²): component k has
        weight wₖ, mean μₖ and variance σₖ². EM needs a starting model. Ours is deliberately
        poor: three equal, wide bumps at −2, 0 and 2.

        The next cell draws the start model (red, with its three weighted components thin)
        and the true density (dashed) over the data.
        """)
    nb.code("""
        grid = np.linspace(x.min(), x.max(), 500)

        def density(model, points=grid):
            \"\"\"p(x) of a model at the given points.\"\"\"
            return np.exp(model.seq_log_density(seq_encode(points, model=model)))

        def draw(ax, model, label, colour="#c0392b", legend=True):
            \"\"\"Histogram of the data, the true density, the model and its weighted components.\"\"\"
            ax.hist(x, bins=120, density=True, color="#c8d3e0")
            ax.plot(grid, density(truth), "k--", lw=1, label="truth")
            for w_k, component in zip(model.w, model.components):
                ax.plot(grid, w_k * density(component), color=colour, lw=0.8)
            ax.plot(grid, density(model), color=colour, lw=2, label=label)
            if legend:
                ax.legend(loc="upper left", fontsize=8)

        start = MixtureDistribution([GaussianDistribution(mu, 2.0) for mu in (-2.0, 0.0, 2.0)],
                                    w=[1 / 3, 1 / 3, 1 / 3])
        fig, ax = plt.subplots(figsize=(8, 2.8))
        draw(ax, start, "start model")
        ax.set(title="the starting guess against the data", xlabel="x")
        plt.show()
        """)
    nb.md("""
        ## The E-step: how much each component explains each point

        For every point xₙ and component k, the E-step computes the **responsibility**
        rₙₖ = wₖ · N(xₙ | μₖ, σₖ²) / p(xₙ): the probability, under the current model, that
        xₙ came from component k. Each point's responsibilities add up to 1.

        The next cell computes them with plain numpy (in logs, so nothing underflows) and compares
        them with the library's `seq_posterior`.
        """)
    nb.code("""
        def parameters(model):
            \"\"\"(w, mu, sigma2) as arrays of length K.\"\"\"
            return (np.asarray(model.w), np.array([c.mu for c in model.components]),
                    np.array([c.sigma2 for c in model.components]))

        def log_joint(w, mu, sigma2, points):
            \"\"\"(N, K) array of log( w_k N(x_n | mu_k, sigma2_k) ).\"\"\"
            return np.log(w) - 0.5 * np.log(2 * np.pi * sigma2) - 0.5 * (points[:, None] - mu) ** 2 / sigma2

        def responsibilities(model, points):
            joint = log_joint(*parameters(model), points)
            return np.exp(joint - np.logaddexp.reduce(joint, axis=1, keepdims=True))

        r = responsibilities(start, x)
        library = start.seq_posterior(seq_encode(x, model=start))
        print("shape:", r.shape, "   every row sums to 1:", np.allclose(r.sum(axis=1), 1.0))
        print(f"largest difference from the library's E-step: {np.abs(r - library).max():.1e}")
        """)
    nb.md("""
        The picture: the responsibilities of the start model at each x, stacked. Far left the
        left component takes almost every point; between two bumps the points are shared.
        """)
    nb.code("""
        fig, ax = plt.subplots(figsize=(8, 2.5))
        ax.stackplot(grid, responsibilities(start, grid).T, alpha=0.85,
                     labels=[f"component {k}" for k in range(3)])
        ax.set(title="E-step: responsibility of each component for a point at x (start model)",
               xlabel="x", ylabel="r", ylim=(0, 1))
        ax.legend(loc="center right", fontsize=8)
        plt.show()
        """)
    nb.md("""
        ## Sufficient statistics: three sums per component

        The M-step never needs the points themselves, only three sums per component:

        * Nₖ = Σₙ rₙₖ (how many points component k explains),
        * Sₖ = Σₙ rₙₖ xₙ,
        * Qₖ = Σₙ rₙₖ xₙ².

        These are the **sufficient statistics**. The next cell computes them by hand and shows
        they are exactly what the library's accumulator holds after one E-step pass
        (`acc.value()` is the counts, then `[N, S, Q]` per component).
        """)
    nb.code("""
        N_k, S_k, Q_k = r.sum(axis=0), r.T @ x, r.T @ x**2

        enc = seq_encode(x, model=start)          # encode once: each point becomes the row [1, x, x²]
        est = start.estimator()
        acc = est.accumulator_factory().make()
        acc.seq_update(enc, None, start)          # one E-step pass over the data
        counts, per_component = acc.value()

        print("k       N_k (hand)      N_k (lib)        S_k (hand)      S_k (lib)        Q_k (hand)      Q_k (lib)")
        for k in range(3):
            print(f"{k}  {N_k[k]:14.4f} {per_component[k][0]:14.4f}   {S_k[k]:14.4f} {per_component[k][1]:14.4f}"
                  f"   {Q_k[k]:14.4f} {per_component[k][2]:14.4f}")
        """)
    nb.md("""
        Because they are sums, the statistics of two halves of the data **add up** to the
        statistics of the whole. That is what makes EM easy to distribute (notebook 02): each
        worker sums over its own points, and only the sums travel.

        The next cell accumulates each half separately, combines them, and checks the result
        against the whole; the picture stacks the two halves' Nₖ.
        """)
    nb.code("""
        def statistics(points, model=start):
            acc = est.accumulator_factory().make()
            acc.seq_update(seq_encode(points, model=model), None, model)
            return acc

        first, second = statistics(x[:10_000]), statistics(x[10_000:])
        both = statistics(x[:10_000]).combine(second.value())
        whole = flatten_value(acc.value())
        difference = np.abs(flatten_value(both.value()) - whole).max() / np.abs(whole).max()
        print(f"half + half vs whole, largest relative difference: {difference:.1e} (rounding)")

        fig, ax = plt.subplots(figsize=(5, 2.6))
        n_first, n_second = first.value()[0], second.value()[0]
        ax.bar(range(3), n_first, label="first half")
        ax.bar(range(3), n_second, bottom=n_first, label="second half")
        ax.plot(range(3), counts, "k_", ms=40, mew=2, label="whole data")
        ax.set(title="Nₖ: the halves add up to the whole", xticks=range(3), xlabel="component k")
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.02, 1))
        plt.show()
        """)
    nb.md("""
        ## The M-step: new parameters from the sums

        Setting the new parameters to maximise the expected log-density gives closed forms:

        * wₖ = Nₖ / N,
        * μₖ = Sₖ / Nₖ,
        * σₖ² = Qₖ / Nₖ − μₖ².

        The next cell computes them by hand, checks them against the library's M-step
        (`est.estimate`), and draws the model before and after this first EM step.
        """)
    nb.code("""
        w_new, mu_new = N_k / len(x), S_k / N_k
        sigma2_new = Q_k / N_k - mu_new**2
        after_one = est.estimate(len(x), acc.value())
        print("by hand:   w", np.round(w_new, 4), " mu", np.round(mu_new, 4), " sigma2", np.round(sigma2_new, 4))
        print("library:   w", np.round(after_one.w, 4), " mu", np.round(parameters(after_one)[1], 4),
              " sigma2", np.round(parameters(after_one)[2], 4))

        fig, axes = plt.subplots(1, 2, figsize=(10, 2.6), sharey=True)
        draw(axes[0], start, "before (start)")
        draw(axes[1], after_one, "after one EM step", colour="#2980b9")
        plt.show()
        """)
    nb.md("""
        ## Many steps, and the log-density

        `em_step(enc, est, model)` does the E-step and the M-step in one pass over the data. It
        also returns the log-density of the data under the model it started from, log p(x₁…x_N),
        which the E-step gets for free while normalising the responsibilities.

        The next cell runs 40 steps and plots the log-density per step: it climbs fast, then
        levels off as the fit converges. Its smallest step-to-step change is printed.
        """)
    nb.code("""
        model, models, log_densities = start, [start], []
        for step in range(40):
            result = em_step(enc, est, model)
            log_densities.append(result.log_density)   # log-density of the model this step started from
            model = result.model
            models.append(model)
        print(f"smallest change from one step to the next: {np.diff(log_densities).min():.3g} (never negative)")

        fig, axes = plt.subplots(1, 2, figsize=(10, 2.6))
        axes[0].plot(range(1, 41), log_densities, "o-", ms=3)
        axes[0].set(title="log-density of the data per EM step", xlabel="EM step")
        axes[1].semilogy(range(2, 41), np.diff(log_densities), "o-", ms=3, color="#27ae60")
        axes[1].set(title="increase per step (log scale)", xlabel="EM step")
        plt.tight_layout()
        plt.show()
        """)
    nb.md("""
        ## Why the log-density never decreases

        For any responsibilities q, Jensen's inequality gives a **lower bound** on the log-density:

        log p(x | θ) ≥ B_q(θ) = Σₙ Σₖ qₙₖ · log( wₖ N(xₙ | μₖ, σₖ²) / qₙₖ ).

        * The **E-step** sets q to the responsibilities at the current θ_old. That makes the
          bound touch the log-density there: B_q(θ_old) = log p(x | θ_old).
        * The **M-step** picks the θ_new that maximises B_q (the closed forms above do exactly that).

        So log p(x | θ_new) ≥ B_q(θ_new) ≥ B_q(θ_old) = log p(x | θ_old). The next cell draws
        both along the straight line from θ_old (t = 0, the start) to θ_new (t = 1, after one step):
        the bound stays below, touches at t = 0 and peaks at t = 1.
        """)
    nb.code("""
        old, new = parameters(models[0]), parameters(models[1])
        q = responsibilities(models[0], x)           # E-step at the old parameters
        q_log_q = np.sum(q * np.log(q, where=q > 0, out=np.zeros_like(q)))

        ts, log_p, bound = [], [], []
        for t in np.linspace(-0.5, 1.5, 81):
            w, mu, sigma2 = ((1 - t) * a + t * b for a, b in zip(old, new))
            if np.all(w > 0) and np.all(sigma2 > 0):   # stay where the parameters make sense
                joint = log_joint(w / w.sum(), mu, sigma2, x)
                ts.append(t)
                log_p.append(np.logaddexp.reduce(joint, axis=1).sum())
                bound.append(np.sum(q * joint) - q_log_q)

        fig, ax = plt.subplots(figsize=(8, 3))
        ax.plot(ts, log_p, lw=2, label="log p(x | θ)")
        ax.plot(ts, bound, "--", lw=2, label="lower bound B_q(θ), q from the E-step at θ_old")
        ax.axvline(0, color="grey", lw=0.8)
        ax.axvline(1, color="grey", lw=0.8)
        ax.set(title="one EM step: the bound touches at θ_old (t=0) and is maximised at θ_new (t=1)",
               xlabel="t   (θ = θ_old + t · (θ_new − θ_old))")
        ax.legend(fontsize=8)
        plt.show()
        """)
    nb.md("""
        ## Watching a fit with the EMPanel

        The `EMPanel` steps EM for you and redraws after each step: left the log-density per step,
        middle the model's density over the data, right the time the step took. In a live notebook
        its buttons (Step, Run N, Pause, Back, Reset) drive it; here we call their Python twins.

        The next cell builds a panel on the encoded data, from the same poor start.
        """)
    nb.code("""
        panel = EMPanel(handle=enc, estimator=est, model=start, data_sample=x)
        panel
        """)
    nb.md("""
        One step, then five more (the **Step** and **Run N** buttons): watch the density in the
        middle plot move towards the three bumps.
        """)
    nb.code("""
        panel.step()
        panel.run(5)
        if panel.error:  # a failed step shows in the panel; raise it here too
            raise panel.error
        print(f"{len(panel.history)} steps, log-density now {panel.history[-1].log_density:.2f}")
        """)
    nb.md("""
        `back(k)` (the **Back** button) rewinds k steps: the history drops them and the panel
        shows that earlier model again. EM is deterministic, so stepping forward again reproduces
        exactly the same models. The next cell checks that.
        """)
    nb.code("""
        sixth = panel.history[-1].model
        panel.back(3)
        print("after back(3):", len(panel.history), "steps")
        panel.run(3)
        print("same sixth model again:", repr(panel.history[-1].model) == repr(sixth))
        """)
    nb.md("Now run 34 more steps, to 40 in all; the panel above shows the converged fit.")
    nb.code("""
        panel.run(34)
        if panel.error:
            raise panel.error
        print(f"{len(panel.history)} steps, log-density {panel.history[-1].log_density:.2f}")
        """)
    nb.md("""
        An exported notebook cannot run the widget's code, so `snapshot()` keeps a static picture
        of the panel as it is now.
        """)
    nb.code("panel.snapshot()")
    nb.md("""
        The panel's history keeps every model. The next cell draws the density at a few steps side
        by side: the whole fit in one picture.
        """)
    nb.code("""
        shown = [0, 1, 3, 10, 40]
        fig, axes = plt.subplots(1, len(shown), figsize=(14, 2.4), sharey=True)
        for ax, step in zip(axes, shown):
            model = start if step == 0 else panel.history[step - 1].model
            draw(ax, model, f"step {step}", legend=False)
            ax.set_title("start" if step == 0 else f"after {step} step{'s' * (step > 1)}", fontsize=9)
        plt.tight_layout()
        plt.show()
        """)
    nb.md("""
        ## What EM found

        The next cell lists the fitted components next to the true ones, ordered by mean. With
        20,000 points they agree to about two decimals.
        """)
    nb.code("""
        fitted = panel.model
        print("          weight          mean           variance")
        print("        true  fitted   true  fitted   true  fitted")
        for (tw, tc), (fw, fc) in zip(sorted(zip(truth.w, truth.components), key=lambda p: p[1].mu),
                                      sorted(zip(fitted.w, fitted.components), key=lambda p: p[1].mu)):
            print(f"      {tw:5.2f}  {fw:6.3f}  {tc.mu:5.2f}  {fc.mu:6.3f}  {tc.sigma2:5.2f}  {fc.sigma2:6.3f}")
        """)
    nb.md("""
        ## Summary

        * E-step: responsibilities rₙₖ, and from them three sums per component (Nₖ, Sₖ, Qₖ).
        * M-step: new weights, means and variances from those sums alone.
        * The log-density never decreases, because each step maximises a lower bound that touches it.
        * Sums of parts add up to the sum of the whole: the idea behind distributed EM in
          **02_distributed_em.ipynb**.

        This notebook started no processes, so there is nothing to stop.
        """)
    return nb.build()


def distributed_em() -> nbformat.NotebookNode:
    nb = Notebook("distributed-em")
    nb.md("""
        # 02 · Distributed EM on a cluster of engines

        The same EM as in notebook 01, on 4 worker processes. Each worker (a **rank**) keeps a
        quarter of the data; per EM step the ranks exchange only the sufficient statistics. You
        will

        1. start 4 engines that form one `torch.distributed` group,
        2. shard the data across them with `TorchRunEncodedData`,
        3. step EM interactively and watch the all-reduced log-density,
        4. check that the 4-rank model equals the single-process model,
        5. see what travels between ranks per step and what a step costs,
        6. fit a 2-D mixture the same way, and stop everything.
        """)
    nb.md("""
        The next cell imports what the notebook uses and loads the mixle magics
        (`%mixle_cluster`, `%mixle_push`, `%mixle_pull`, `%%mixle`).
        """)
    nb.code("""
        import matplotlib.pyplot as plt
        import numpy as np
        import torch

        from mixle_nb.stats import (GaussianDistribution, MixtureDistribution,
                                    MultivariateGaussianDistribution, em_step, seq_encode)
        from mixle_nb.stats.values import flatten_value
        from mixle_nb.widgets import EMPanel

        torch.set_num_threads(1)  # this kernel's maths on one thread: the engines need the cores
        %load_ext mixle_nb
        """)
    nb.md("""
        ## Start the cluster

        `%mixle_cluster start 4` launches an ipyparallel controller and 4 engines, then joins the
        engines into one `torch.distributed` group: engine r is rank r. On one machine the group
        talks over loopback only. The cluster object is bound to the variable `mixle`.

        ![the cluster](attachment:cluster.png)

        The next cell starts it and shows one row per rank. (On this 2-core machine 4 engines share
        2 cores: fine for learning, not for speed.)
        """, cluster=cluster_diagram())
    nb.code("%mixle_cluster start 4")
    nb.md("""
        ## The data

        200,000 points from a 4-component mixture, drawn here in the notebook, and a starting
        model with four wide bumps. The next cell draws both.
        """)
    nb.code("""
        truth = MixtureDistribution([GaussianDistribution(-5.0, 1.0), GaussianDistribution(-1.5, 0.6),
                                     GaussianDistribution(1.5, 0.8), GaussianDistribution(5.0, 1.5)],
                                    w=[0.2, 0.3, 0.3, 0.2])
        x = truth.sampler(seed=1).sample(200_000)
        start = MixtureDistribution([GaussianDistribution(mu, 2.0) for mu in (-3.0, -1.0, 1.0, 3.0)],
                                    w=[0.25] * 4)
        est = start.estimator()

        grid = np.linspace(x.min(), x.max(), 500)
        fig, ax = plt.subplots(figsize=(8, 2.6))
        ax.hist(x, bins=150, density=True, color="#c8d3e0")
        ax.plot(grid, np.exp(start.seq_log_density(seq_encode(grid, model=start))), color="#c0392b",
                label="start model")
        ax.set(title="200,000 points and the starting model", xlabel="x")
        ax.legend(fontsize=8)
        plt.show()
        """)
    nb.md("""
        ## Shard the data across the ranks

        `%mixle_push` copies notebook variables to every rank under the same names. (In a real job
        each rank would read its own part from disk instead.)
        """)
    nb.code("%mixle_push x est start")
    nb.md("""
        `%%mixle` runs a cell on every rank (`--all` shows every rank's output). Here each rank
        builds a `TorchRunEncodedData` handle: rank r keeps `x[r::4]`, encodes it once and keeps it
        resident for every later step. The cell prints what each rank holds.
        """)
    nb.code("""
        %%mixle --all
        from mixle_nb.parallel import TorchRunEncodedData

        h = TorchRunEncodedData(x, estimator=est)
        my_points = x[h.rank::h.world]
        print(f"{h.local_count:,} of {len(h):,} points resident")
        """)
    nb.md("""
        `%mixle_pull name --all` brings a variable back from every rank. The next cell pulls each
        rank's points and overlays their histograms: every shard looks like the whole data, a
        quarter of the size.
        """)
    nb.code("""
        shards = %mixle_pull my_points --all
        fig, ax = plt.subplots(figsize=(8, 2.6))
        for rank, points in enumerate(shards):
            ax.hist(points, bins=150, histtype="step", label=f"rank {rank}: {len(points):,} points")
        ax.set(title="each rank's shard of the data", xlabel="x")
        ax.legend(fontsize=8)
        plt.show()
        """)
    nb.md("""
        ## Step EM interactively

        `EMPanel(mixle, handle="h", estimator="est", model="start")` drives EM on the ranks; the
        strings are the names these objects have there. Each **Step** sends one call to every rank:
        E-step on the rank's shard → one all-reduce of the statistics → the same M-step everywhere.
        Left: the all-reduced log-density per step; middle: the model over a sample of rank 0's
        points; right: each rank's E-step time.

        The next cell creates the panel.
        """)
    nb.code("""
        panel = EMPanel(mixle, handle="h", estimator="est", model="start")
        panel
        """)
    nb.md("One step, then 24 more (the **Step** and **Run N** buttons); the panel above redraws as they go.")
    nb.code("""
        panel.step()
        panel.run(24)
        if panel.error:  # a failed step shows in the panel; raise it here too
            raise panel.error
        """)
    nb.md("A static picture of the panel after 25 steps, for exported reports:")
    nb.code("panel.snapshot()")
    nb.md("""
        The all-reduced log-density per EM step as a table. Each value belongs to the model the
        step started from; it never decreases.
        """)
    nb.code("""
        print("1-D mixture on 4 ranks: all-reduced log-density per EM step")
        print(" step     log-density")
        for record in panel.history:
            print(f"{record.step:5d}  {record.log_density:14.4f}")
        """, tags=("summary",))
    nb.md("""
        ## The same model as one process

        Summing in a different order changes only the last bits of the result, so the 4-rank fit
        must equal a single-process fit from the same start after the same number of steps, up to
        rounding. The next cell runs those 25 steps here in the notebook with `em_step` on all the
        data, and plots both log-density curves and their difference.
        """)
    nb.code("""
        def parameters(model):
            return np.concatenate([model.w] + [np.ravel(c.mu) for c in model.components]
                                  + [np.ravel(c.sigma2) for c in model.components])

        enc = seq_encode(x, model=start)
        model, single = start, []
        for _ in range(len(panel.history)):
            result = em_step(enc, est, model)
            single.append(result.log_density)
            model = result.model
        distributed = [record.log_density for record in panel.history]

        fig, axes = plt.subplots(1, 2, figsize=(10, 2.6))
        axes[0].plot(range(1, 26), distributed, "o", ms=6, mfc="none", label="4 ranks")
        axes[0].plot(range(1, 26), single, "-", label="1 process")
        axes[0].set(title="log-density per EM step", xlabel="EM step")
        axes[0].legend(fontsize=8)
        relative = np.abs(np.subtract(distributed, single)) / np.abs(single)
        axes[1].semilogy(range(1, 26), np.maximum(relative, 1e-17), "o-", ms=3)  # an exact match sits at the bottom
        axes[1].set(title="relative difference (rounding level)", xlabel="EM step", ylim=(1e-17, 1e-8))
        plt.tight_layout()
        plt.show()
        """)
    nb.md("The agreement in one line: the largest parameter difference after 25 steps.")
    nb.code("""
        gap = np.abs(parameters(panel.model) - parameters(model)).max()
        print(f"4 ranks vs 1 process, same start, 25 EM steps: max |parameter difference| = {gap:.1e}")
        """, tags=("summary",))
    nb.md("""
        ## What travels between ranks per step

        The data never moves after sharding. Per step each rank contributes one vector to one
        all-reduce: the count of points, the log-density, and the statistics (K counts, then
        [Σr, Σr·x, Σr·x²] per component), so K·(1+2D) + K + 2 float64 numbers: 18 here, whatever
        the number of points.

        ![one EM step on the cluster](attachment:em_step.png)

        The next cell counts them from the flattened statistics of an accumulator and compares
        their size with the size of one rank's shard.
        """, em_step=em_step_diagram())
    nb.code("""
        acc = est.accumulator_factory().make()
        acc.seq_update(seq_encode(x[:10], model=start), None, start)
        numbers = 2 + flatten_value(acc.value()).size
        sizes = {"one rank's shard\\n(raw float64)": len(x) // 4 * 8, "sent per rank\\nper EM step": numbers * 8}
        print(f"{numbers} float64 numbers = {numbers * 8} bytes per rank per step")

        fig, ax = plt.subplots(figsize=(5, 2.6))
        ax.bar(list(sizes), list(sizes.values()), color=["#7f8c8d", "#e67e22"])
        for i, size in enumerate(sizes.values()):
            ax.text(i, size * 1.3, f"{size:,} B", ha="center", fontsize=9)
        ax.set(title="bytes: data that stays vs statistics that travel", ylabel="bytes",
               yscale="log", ylim=(1, 1e7))
        plt.show()
        """)
    nb.md("""
        ## What a step costs

        Each rank records how long its last step spent in the **E-step** (its own work on its
        shard), the **fold** (the all-reduce, which also waits for the slowest rank) and the
        **M-step** (tiny). The next cell keeps each rank's timings of the last step in a variable,
        `timing`, on that rank.
        """)
    nb.code("""
        %%mixle
        timing = h.last_timings
        """)
    nb.md("""
        The next cell pulls them back (`%mixle_pull timing --all`) and draws milliseconds per rank,
        stacked. With 4 ranks on 2 cores the fold is mostly waiting for a rank that was not
        scheduled; on a machine with a core per rank it is small.
        """)
    nb.code("""
        timings = %mixle_pull timing --all
        parts = {"E-step": [t.e_step_s for t in timings], "fold (all-reduce)": [t.fold_s for t in timings],
                 "M-step": [t.m_step_s for t in timings]}
        fig, ax = plt.subplots(figsize=(6, 2.8))
        bottom = np.zeros(len(timings))
        for label, seconds in parts.items():
            ax.bar(range(len(timings)), np.multiply(seconds, 1000), bottom=bottom, label=label)
            bottom += np.multiply(seconds, 1000)
        ax.set(title="last EM step, per rank", xlabel="rank", ylabel="milliseconds", xticks=range(len(timings)))
        ax.legend(fontsize=8)
        plt.show()
        for rank, t in enumerate(timings):
            print(f"rank {rank}: {t.shard:,} points  E-step {t.e_step_s * 1e3:6.1f} ms  "
                  f"fold {t.fold_s * 1e3:6.1f} ms  M-step {t.m_step_s * 1e3:5.2f} ms")
        """)
    nb.md("""
        ## A second example: a 2-D mixture

        Nothing above was specific to one dimension. Here are 20,000 points in 2-D from three
        Gaussians with full covariance matrices, and a start of three round bumps near the middle.
        The next cell pushes them to the ranks.
        """)
    nb.code("""
        truth2 = MixtureDistribution([
            MultivariateGaussianDistribution([-2.5, 0.0], [[1.0, 0.6], [0.6, 1.0]]),
            MultivariateGaussianDistribution([2.0, 2.0], [[0.6, -0.3], [-0.3, 0.8]]),
            MultivariateGaussianDistribution([1.5, -2.5], [[1.5, 0.0], [0.0, 0.3]])], w=[0.4, 0.3, 0.3])
        x2 = truth2.sampler(seed=2).sample(20_000)
        start2 = MixtureDistribution([MultivariateGaussianDistribution(mu, 3 * np.eye(2))
                                      for mu in ([-1.0, 0.0], [0.0, 1.0], [1.0, 0.0])], w=[1 / 3] * 3)
        est2 = start2.estimator()
        %mixle_push x2 est2 start2
        """)
    nb.md("Each rank builds a second handle, `h2`, on its quarter of the 2-D points:")
    nb.code("""
        %%mixle
        h2 = TorchRunEncodedData(x2, estimator=est2)
        print(f"rank 0 holds {h2.local_count:,} of {len(h2):,} points")
        """)
    nb.md("""
        A second panel on `h2`, run for 25 steps. The middle plot now shows each component as an
        ellipse two standard deviations wide over the points (thicker = larger weight).
        """)
    nb.code("""
        panel2 = EMPanel(mixle, handle="h2", estimator="est2", model="start2")
        panel2.run(25)
        if panel2.error:
            raise panel2.error
        panel2
        """)
    nb.md("A static picture of the 2-D fit after 25 steps:")
    nb.code("panel2.snapshot()")
    nb.md("""
        With full covariances each component has 1 + D + D² sums, so each rank now sends
        K·(1 + D + D²) + K + 2 numbers per step. The next cell counts them.
        """)
    nb.code("""
        acc2 = est2.accumulator_factory().make()
        acc2.seq_update(seq_encode(x2[:10], model=start2), None, start2)
        print(f"2-D, K=3, full covariance: {2 + flatten_value(acc2.value()).size} float64 numbers "
              "per rank per step")
        """)
    nb.md("""
        ## Stop the cluster

        `%mixle_cluster status` shows each rank's memory and its last call's time; then
        `%mixle_cluster stop` leaves the group, stops the engines and the controller, and waits
        until their processes have exited. The next cell does both.
        """)
    nb.code("""
        %mixle_cluster status
        %mixle_cluster stop
        """)
    nb.md("""
        ## Summary

        * Each rank keeps its shard; per step only K·(1+2D) + K + 2 numbers per rank travel, in one all-reduce.
        * Every rank runs the same M-step on the same totals, so every rank holds the same model,
          and it equals the one-process model up to rounding.
        * The fold's cost is mostly waiting for the slowest rank.

        Next, **03_streaming_transformer.ipynb** trains a neural network across the same kind of
        cluster, where the gradient, not a statistic, is what travels.
        """)
    return nb.build()


def streaming_transformer() -> nbformat.NotebookNode:
    nb = Notebook("streaming-transformer")
    nb.md("""
        # 03 · Training a tiny transformer across the engines

        A character-level language model learns to continue English text. Four ranks each stream
        windows from their own part of the text and train together with `DistributedDataParallel`
        (DDP). You will see

        1. the text and how it is split across ranks,
        2. what the untrained model writes,
        3. the live loss of each rank and their mean,
        4. what the model writes after training,
        5. what the gradient all-reduce does, and why no statistics are gathered.
        """)
    nb.md("""
        The next cell imports what the notebook uses and loads the mixle magics.
        """)
    nb.code("""
        from collections import Counter

        import matplotlib.pyplot as plt
        import numpy as np
        import torch

        from mixle_nb.neural import CharTokenizer, StreamingTransformerLeafEstimator, build_causal_lm, stdlib_text
        from mixle_nb.widgets import TrainPanel

        torch.set_num_threads(1)  # this kernel's maths on one thread: the engines need the cores
        %load_ext mixle_nb
        """)
    nb.md("""
        ## Start 4 engines

        As in notebook 02: 4 engines, one `torch.distributed` group over loopback, bound to `mixle`.
        The next cell starts them.
        """)
    nb.code("%mixle_cluster start 4")
    nb.md("""
        ## The text and its tokens

        `stdlib_text` joins the docstrings of some Python standard-library modules: real English
        prose, available offline. A character-level tokenizer gives each distinct character an id.
        The next cell takes 40,000 characters, prints their alphabet size and an excerpt, and draws
        the most common characters.
        """)
    nb.code("""
        text = stdlib_text(40_000)
        tok = CharTokenizer.fit(text)
        ids = tok.encode(text)
        print(f"{len(text):,} characters, {tok.vocab_size} distinct. Guessing uniformly among them would "
              f"cost log({tok.vocab_size}) = {np.log(tok.vocab_size):.2f} nats per character. An excerpt:\\n")
        print(text[2000:2300])

        common = Counter(text).most_common(30)
        fig, ax = plt.subplots(figsize=(9, 2.4))
        ax.bar(["␣" if c == " " else repr(c)[1:-1] for c, _ in common], [n / len(text) for _, n in common])
        ax.set(title="the 30 most common characters (␣ is a space, \\\\n a new line)", ylabel="share")
        plt.show()
        """)
    nb.md("""
        ## The model: same seed, same weights on every rank

        A tiny decoder-only transformer: 2 blocks, 64-wide, 4 attention heads, 32 characters of
        context. `build_causal_lm(..., seed=0)` makes its initial weights depend only on the seed.
        We build it once here and push it (inside its estimator, with the learning rate) to every
        rank, together with the token ids and the tokenizer, so all ranks start identical.
        The next cell does that and prints the model's size.
        """)
    nb.code("""
        lm = StreamingTransformerLeafEstimator(
            build_causal_lm(tok.vocab_size, d_model=64, n_layer=2, n_head=4, block=32, seed=0), lr=1e-2)
        n_weights = sum(p.numel() for p in lm.module.parameters())
        print(f"{n_weights:,} weights")
        %mixle_push ids tok lm
        """)
    nb.md("""
        ## Streaming the data

        On each rank a `StreamingTokenEncodedData` handle keeps one contiguous quarter of the token
        ids and cuts training windows from it on the fly: 32 characters of context, and the
        character that follows as the target. A batch is 32 windows in a shuffled order; the full
        windows × 32 matrix is never built.

        ![shards and windows](attachment:shards.png)

        The next cell builds the handle on every rank and prints its size and steps per epoch.
        """, shards=shards_diagram())
    nb.code("""
        %%mixle --all
        from mixle_nb.parallel import StreamingTokenEncodedData

        th = StreamingTokenEncodedData(ids, block=32, batch_size=32, epochs=1)
        print(f"{len(th):,} tokens, {th.total_steps} steps in one epoch")
        """)
    nb.md("""
        ## Before training

        On rank 0 (`--targets 0`), the untrained model continues the prompt "The " with 150
        characters. Its next-character guesses are close to uniform, so the output is noise.
        """)
    nb.code("""
        %%mixle --targets 0
        untrained = th.pysp_seq_initialize(lm, None, 1.0)   # the pushed model as it is, untrained
        print(tok.decode(untrained.generate(tok.encode("The "), 150, temperature=0.8, seed=0)))
        """)
    nb.md("""
        ## Training, with the loss of every rank live

        `TrainPanel` trains every rank on its own shard, in calls of 50 steps. Every 10 steps each
        rank publishes its mean loss (in nats per character) through ipyparallel's data channel:
        thin lines per rank, the thick line is their mean. Compare it with the uniform guess
        printed above.

        The next cell creates the panel.
        """)
    nb.code("""
        panel = TrainPanel(mixle, handle="th", estimator="lm", tokenizer=tok, prompt="The ",
                           sample_chars=150, chunk_steps=50, report_every=10)
        panel
        """)
    nb.md("Train one epoch (the **Train** button); the panel above redraws as the ranks report.")
    nb.code("""
        panel.train()
        if panel.error:  # a failure shows in the panel; raise it here too
            raise panel.error
        print(f"trained {max(points[-1][0] for points in panel.curves.values())} steps on each rank")
        """)
    nb.md("A static picture of the loss curves, for exported reports:")
    nb.code("panel.snapshot()")
    nb.md("""
        ## After training

        The mean loss over the ranks at the first and the last report, and what the trained model
        writes from the same prompt (rank 0, same temperature and seed as before). After one short
        epoch it is far from fluent, but it has learned spaces, short common words such as "the"
        and "of", and word-like chunks of letters.
        """)
    nb.code("""
        first_step = min(points[0][0] for points in panel.curves.values())
        last_step = max(points[-1][0] for points in panel.curves.values())
        start_loss = np.mean([points[0][1] for points in panel.curves.values()])
        end_loss = np.mean([points[-1][1] for points in panel.curves.values()])
        print(f"mean loss over {len(panel.curves)} ranks: {start_loss:.2f} nats/char at step {first_step}"
              f" -> {end_loss:.2f} nats/char at step {last_step}")
        print("generated after training:")
        print(panel.sample_text)
        """, tags=("summary",))
    nb.md("""
        ## What the gradient all-reduce does

        After backward, each rank has the gradient of the loss on **its own** batch. DDP adds an
        all-reduce inside backward that replaces it by the **mean** of the 4 ranks' gradients. Every
        rank then takes the same optimizer step from the same weights, so the 4 replicas stay
        identical, just as if one process had trained on batches 4 times larger.

        ![a DDP training step](attachment:ddp.png)

        The next cell collects each rank's trained weights (as one flat array) so we can compare them.
        """, ddp=ddp_diagram())
    nb.code("""
        %%mixle
        import torch
        flat_weights = torch.cat([p.detach().flatten() for p in lm.module.parameters()]).numpy()
        """)
    nb.md("""
        The picture: how far each rank's weights moved from the shared start (the notebook still
        holds the untrained copy), and the largest difference between any rank and rank 0.
        """)
    nb.code("""
        weights = %mixle_pull flat_weights --all
        initial = torch.cat([p.detach().flatten() for p in lm.module.parameters()]).numpy()
        moved = [np.linalg.norm(w - initial) for w in weights]
        apart = max(np.abs(w - weights[0]).max() for w in weights)
        print(f"largest difference between any rank's weights and rank 0's: {apart}")

        fig, ax = plt.subplots(figsize=(6, 2.6))
        ax.bar(range(len(weights)), moved, color="#2980b9")
        ax.set(title=f"distance travelled from the start: the same on every rank (max gap {apart:g})",
               xlabel="rank", ylabel="‖w − w_start‖", xticks=range(len(weights)))
        plt.show()
        """)
    nb.md("""
        ## Why no statistics are gathered

        EM (notebook 02) has a closed-form M-step: the new model is a function of sums over the
        data, so ranks exchange sums once per pass. A neural network has no such step. The closest
        thing to a "statistic" is the gradient, which only moves the weights a little and has to be
        recomputed after every step. So the only traffic is the gradient all-reduce inside each
        backward: no per-rank statistics are folded and no model is broadcast (the replicas are
        already equal). The loss curves reach the notebook outside the group, through ipyparallel.

        The next cell compares what crosses between ranks per step in the two cases.
        """)
    nb.code("""
        per_step = {"EM step, 1-D mixture\\nK=4 (notebook 02)": 18 * 8,
                    "training step here\\n(float32 gradient)": n_weights * 4}
        for name, size in per_step.items():
            print(f"{name.replace(chr(10), ' ')}: {size:,} bytes per rank")
        fig, ax = plt.subplots(figsize=(5, 2.6))
        ax.bar(list(per_step), list(per_step.values()), color=["#e67e22", "#2980b9"])
        for i, size in enumerate(per_step.values()):
            ax.text(i, size * 1.3, f"{size:,} B", ha="center", fontsize=9)
        ax.set(title="what each rank all-reduces per step", ylabel="bytes", yscale="log", ylim=(1, 1e7))
        plt.show()
        """)
    nb.md("""
        ## Stop the cluster

        The next cell stops the engines and the controller and waits for their processes to exit.
        """)
    nb.code("%mixle_cluster stop")
    nb.md("""
        ## Summary

        * Every rank starts from the same seeded weights and streams windows from its own shard.
        * DDP's gradient all-reduce keeps the replicas identical step after step; nothing else
          crosses between ranks.
        * The loss curves travel to the notebook through ipyparallel, not through the training group.

        **04_from_notebook_to_torchrun.ipynb** runs the same handles from a terminal.
        """)
    return nb.build()


LM_SCRIPT = '''\
"""Streaming training from a terminal: torchrun --standalone --nproc_per_node 2 train_lm.py"""
import torch

from mixle_nb.neural import CharTokenizer, StreamingTransformerLeafEstimator, build_causal_lm, stdlib_text
from mixle_nb.parallel import StreamingTokenEncodedData, torchrun_out

torch.set_num_threads(1)
text = stdlib_text(20_000)
tok = CharTokenizer.fit(text)
lm = StreamingTransformerLeafEstimator(
    build_causal_lm(tok.vocab_size, d_model=64, n_layer=2, n_head=4, block=32, seed=0), lr=1e-2)
out = torchrun_out()  # rank 0 prints, the other ranks stay quiet


def report(progress):
    print(f"step {progress['step']:3d}  loss {progress['loss']:.3f}", file=out, flush=True)


with StreamingTokenEncodedData(tok.encode(text), block=32, batch_size=32, max_steps=100,
                               progress=report, progress_every=10) as th:
    print(f"{th.world} ranks, {len(th):,} tokens on this rank", file=out)
    leaf = th.pysp_seq_estimate(lm, None)
    print(tok.decode(leaf.generate(tok.encode("The "), 100, temperature=0.8, seed=0)), file=out)
'''


def notebook_to_torchrun() -> nbformat.NotebookNode:
    nb = Notebook("to-torchrun")
    nb.md("""
        # 04 · From the notebook to `torchrun`

        The handles of notebooks 02 and 03 know nothing about notebooks: they need only a
        `torch.distributed` group. When a fit outgrows a notebook (it runs for hours, needs more
        machines, or must run as a batch job), the same code runs from a terminal under `torchrun`.
        You will see

        1. the EM example script, run with 2 processes,
        2. the streaming-training handle under `torchrun` too,
        3. how one handle serves both launchers,
        4. how to point the cluster at MPI, SSH or Slurm engines, and what that exposes on the network.
        """)
    nb.md("""
        The next cell imports what we need and defines `torchrun(script)`: it runs a script with 2
        processes, exactly as `torchrun --standalone --nproc_per_node 2 script.py` would in a
        terminal (`--standalone` picks a free local port), fails loudly if the script fails, and
        returns what rank 0 printed.
        """)
    nb.code("""
        import re
        import subprocess
        import sys
        import tempfile
        from pathlib import Path

        import matplotlib.pyplot as plt

        def torchrun(script, nproc=2):
            command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                       f"--nproc_per_node={nproc}", str(script)]
            done = subprocess.run(command, capture_output=True, text=True, timeout=300)
            if done.returncode != 0:
                raise RuntimeError(f"torchrun exited with {done.returncode}:\\n{done.stderr[-3000:]}")
            return done.stdout
        """)
    nb.md("""
        ## The EM example script

        `examples/torchrun_fit.py` fits a 3-component 1-D mixture to 200,000 points. Every process
        makes the same data (same seed) and `TorchRunEncodedData` keeps its `data[rank::world]`
        shard, exactly as on the engines in notebook 02. The handle joins the group from the
        variables torchrun sets (`RANK`, `WORLD_SIZE`, `MASTER_ADDR`, `MASTER_PORT`), and
        `torchrun_out()` lets only rank 0 print. The next cell shows the script.
        """)
    nb.code("""
        script = Path("..") / "examples" / "torchrun_fit.py"
        print(script.read_text())
        """)
    nb.md("""
        The next cell runs it with 2 processes and prints rank 0's output: the all-reduced
        log-density per step, then the fitted model.
        """)
    nb.code("""
        em_output = torchrun(script)
        print(em_output)
        """)
    nb.md("The picture: the log-density per step, read back from that output.")
    nb.code("""
        steps = [(int(s), float(v)) for s, v in re.findall(r"step\\s+(\\d+)\\s+log-density (\\S+)", em_output)]
        fig, ax = plt.subplots(figsize=(7, 2.6))
        ax.plot(*zip(*steps), "o-", ms=3)
        ax.set(title="torchrun, 2 processes: all-reduced log-density per EM step", xlabel="EM step")
        plt.show()
        """)
    nb.md("""
        ## The streaming handle under torchrun

        Notebook 03's training runs the same way. The next cell writes a short training script to a
        temporary folder (so nothing is left behind), shows it, runs it with 2 processes, and prints
        rank 0's output: the loss every 10 steps, then generated text.
        """)
    nb.code("LM_SCRIPT = '''\\\n" + LM_SCRIPT + "'''\n" + textwrap.dedent("""
        with tempfile.TemporaryDirectory() as folder:
            lm_script = Path(folder) / "train_lm.py"
            lm_script.write_text(LM_SCRIPT)
            print(LM_SCRIPT)
            print("---- output of rank 0 ----")
            lm_output = torchrun(lm_script)
        print(lm_output)
        """))
    nb.md("The picture: rank 0's loss per report, read back from that output.")
    nb.code("""
        losses = [(int(s), float(v)) for s, v in re.findall(r"step\\s+(\\d+)\\s+loss (\\S+)", lm_output)]
        fig, ax = plt.subplots(figsize=(7, 2.6))
        ax.plot(*zip(*losses), "o-", ms=3)
        ax.set(title="torchrun, 2 processes: rank 0's training loss", xlabel="optimizer step",
               ylabel="nats per character")
        plt.show()
        """)
    nb.md("""
        ## One handle, two launchers

        | | notebook (`%mixle_cluster start N`) | terminal (`torchrun --nproc_per_node N fit.py`) |
        |---|---|---|
        | who starts the processes | `MixleCluster` (ipyparallel engines) | `torchrun` |
        | how the group forms | the cluster calls `init_process_group` on each engine | the handle calls it from `RANK`, `WORLD_SIZE`, `MASTER_*` |
        | how you drive it | cell by cell, panels, `%%mixle` | the script runs to the end |
        | where output goes | rank 0's output streams into the notebook | `torchrun_out()`: rank 0's stdout |

        ![one handle, two launchers](attachment:launchers.png)

        Move to `torchrun` when a fit takes longer than you want to keep a kernel alive, needs
        more machines than a notebook comfortably drives, or must run as a scheduled batch job.
        Explore interactively on a sample first, then run the same handle code at full size.
        """, launchers=launchers_diagram())
    nb.md("""
        ## Engines on other machines: MPI, SSH, Slurm

        `MixleCluster(n, launcher=..., **ipyparallel_options)` (or
        `%mixle_cluster start N --launcher mpi`) starts the engines with one of ipyparallel's
        launchers; the options go to `ipyparallel.Cluster`. For example (not run here, since this
        machine has no MPI, SSH hosts or Slurm):

        ```python
        from traitlets.config import Config
        from mixle_nb.cluster import MixleCluster

        # MPI: mpiexec starts the engines, e.g. on the nodes of your MPI allocation
        cluster = MixleCluster(16, launcher="mpi", controller_ip="*")

        # SSH: how many engines to start on each host
        config = Config()
        config.SSHEngineSetLauncher.engines = {"node1": 4, "node2": 4}
        cluster = MixleCluster(8, launcher="ssh", controller_ip="*", config=config)

        # Slurm: the engines run as one batch job
        config = Config()
        config.SlurmEngineSetLauncher.account = "my-project"
        config.SlurmEngineSetLauncher.timelimit = "01:00:00"
        cluster = MixleCluster(64, launcher="slurm", controller_ip="*", config=config)
        ```

        `controller_ip="*"` lets engines on other hosts reach the controller. Everything else
        (the magics, the panels, the handles) works unchanged.
        """)
    nb.md("""
        ## What the cluster exposes on the network

        * **One host (the default):** the controller listens on 127.0.0.1, the ranks meet through
          a file in a private temporary folder, and gloo is pinned to the loopback interface.
          Nothing is reachable from other machines.
        * **Several hosts:** the controller must listen on the network (its messages are signed
          with the cluster's key, not encrypted). The ranks meet through a **TCPStore on engine 0**
          and then talk over gloo: both are **unauthenticated**, so anyone who can reach those ports
          can join or disturb the group. `torchrun`'s own rendezvous store is the same.
          Run multi-host clusters only on a trusted, private network, such as firewalled cluster nodes.

        ![network exposure](attachment:network.png)
        """, network=network_diagram())
    nb.md("""
        ## Summary

        * The handles need only a process group, so the notebook's code runs unchanged under `torchrun`.
        * Launchers for MPI, SSH and Slurm put engines on other machines; the rest stays the same.
        * On one host nothing leaves loopback; across hosts the rendezvous and gloo links are
          unauthenticated, so keep them on a trusted network.

        Both `torchrun` runs above have finished, and this notebook started no cluster, so no
        process is left running.
        """)
    return nb.build()


NOTEBOOKS = {
    "01_em_by_hand.ipynb": em_by_hand,
    "02_distributed_em.ipynb": distributed_em,
    "03_streaming_transformer.ipynb": streaming_transformer,
    "04_from_notebook_to_torchrun.ipynb": notebook_to_torchrun,
}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=HERE, help="folder to write the notebooks to")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    for name, make in NOTEBOOKS.items():
        nbformat.write(make(), args.out / name)
        print(f"wrote {args.out / name}")


if __name__ == "__main__":
    main()
