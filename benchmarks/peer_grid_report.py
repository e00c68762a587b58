"""The peer grid's heat maps and summaries, from its JSON alone (``benchmarks/peer_grid.py``
writes it; the documentation's ``peer-grid`` directive draws and lists from it at each build).

Needs numpy and matplotlib only, not the contenders.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

OURS = "mixle_nb"
MEASURES = ("iteration", "fit")
COVARIANCE_TYPES = ("full", "tied", "diag", "spherical")
SHORT = {
    "cap": "cap",
    "predicted": "pred",
    "dominated": "dom",
    "memory": "mem",
    "budget": "budget",
    "unsupported": "n/a",
    "no peer": "no peer",
}


def trim_kind(cell: dict[str, Any], measure: str) -> str | None:
    """Why a cell has no ratio for ``measure`` by trimming: ours' trim, else the peers' (all trimmed)."""
    key = f"{measure}_trimmed"
    ours = cell["results"].get(OURS, {}).get(key, {}).get("kind")
    if ours and ours != "no peer":
        return ours
    peers = [r.get(key, {}).get("kind") for lib, r in cell["results"].items() if lib not in (OURS, "mixle_nb before")]
    kinds = [kind for kind in peers if kind and kind != "unsupported"]
    if peers and all(peers) and kinds:
        return Counter(kinds).most_common(1)[0][0]
    return None


def plot(data: dict[str, Any], path: Path, threads: int) -> None:
    """The heat map of one thread count: ours / fastest peer per cell, per iteration and per fit;
    a cell where a peer is ahead framed in black, a trimmed one hatched and labelled with why."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.colors import LogNorm
    from matplotlib.patches import Rectangle

    cells = [c for c in data["cells"] if c["threads"] == threads]
    if not cells:
        return
    rows = sorted(
        {(c["covariance_type"], c["d"], c["k"]) for c in cells},
        key=lambda r: (COVARIANCE_TYPES.index(r[0]), r[1], r[2]),
    )
    cols = sorted({c["n"] for c in cells})
    fig, axes = plt.subplots(1, 2, figsize=(3 + 1.6 * len(cols), 1.2 + 0.26 * len(rows)), squeeze=False)
    norm = LogNorm(vmin=1 / 8, vmax=8)
    for ax, measure in zip(axes[0], MEASURES):
        grid = np.full((len(rows), len(cols)), np.nan)
        for c in cells:
            i, j = rows.index((c["covariance_type"], c["d"], c["k"])), cols.index(c["n"])
            value = c.get(f"{measure}_ratio")
            if value:
                grid[i, j] = value
                ahead = value > 1.0
                ax.text(j, i, f"{value:.2f}", ha="center", va="center", fontsize=6, weight="bold" if ahead else None)
                if ahead:
                    ax.add_patch(Rectangle((j - 0.47, i - 0.45), 0.94, 0.9, fill=False, lw=1.4, ec="black"))
                continue
            kind = trim_kind(c, measure)
            ax.add_patch(Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, hatch="///", ec="0.7", lw=0))
            ax.text(j, i, SHORT.get(kind, kind) if kind else "–", ha="center", va="center", fontsize=5.5, color="0.3")
        image = ax.imshow(grid, cmap="coolwarm", norm=norm, aspect="auto")
        ax.set_xticks(range(len(cols)), [f"{n:.0e}".replace("e+0", "e") for n in cols], fontsize=7)
        ax.set_xlabel("N", fontsize=7)
        ax.set_yticks(range(len(rows)), [f"{cov} D={d} K={k}" for cov, d, k in rows], fontsize=6)
        ax.set_title(
            f"ours / fastest peer per {measure}, {threads} thread(s)\n(< 1 blue: ahead; framed: a peer ahead)",
            fontsize=8,
        )
        bar = fig.colorbar(image, ax=ax, shrink=0.6)
        ticks = [1 / 8, 1 / 4, 1 / 2, 1, 2, 4, 8]
        bar.set_ticks(ticks, labels=["1/8", "1/4", "1/2", "1", "2", "4", "8"])
        bar.minorticks_off()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def heat_map_path(stem: Path, threads: int) -> Path:
    """Where the heat map of ``threads`` goes beside the JSON: ``STEM_1thread.png``."""
    return stem.with_name(f"{stem.name}_{threads}thread.png")


def plot_all(data: dict[str, Any], stem: Path) -> list[Path]:
    """A heat map per thread count in the JSON, beside it; their paths."""
    paths = []
    for threads in sorted({c["threads"] for c in data["cells"]}):
        path = heat_map_path(stem, threads)
        plot(data, path, threads)
        paths.append(path)
    return paths


def ahead_rows(data: dict[str, Any]) -> list[list[Any]]:
    """The cells where a peer is ahead of us: threads, covariance, D, K, N, measure, ours over
    it, the peer, our time and its (seconds)."""
    rows = []
    for c in sorted(
        data["cells"],
        key=lambda c: (c["threads"], COVARIANCE_TYPES.index(c["covariance_type"]), c["d"], c["k"], c["n"]),
    ):
        for measure in MEASURES:
            ratio = c.get(f"{measure}_ratio")
            if ratio is not None and ratio > 1.0:
                peer = c["fastest_peer"][measure]
                key = f"{measure}_s"
                rows.append(
                    [
                        c["threads"],
                        c["covariance_type"],
                        c["d"],
                        c["k"],
                        c["n"],
                        measure,
                        ratio,
                        peer,
                        c["results"][OURS][key],
                        c["results"][peer][key],
                    ]
                )
    return rows


def median_rows(data: dict[str, Any]) -> list[list[Any]]:
    """Per thread count and N: for each measure the median of ours over the fastest peer, the
    cells where a peer is ahead and the cells with a ratio."""
    groups: dict[tuple[int, float], dict[str, list[float]]] = {}
    for c in data["cells"]:
        group = groups.setdefault((c["threads"], c["n"]), {measure: [] for measure in MEASURES})
        for measure in MEASURES:
            ratio = c.get(f"{measure}_ratio")
            if ratio is not None:
                group[measure].append(ratio)
    rows = []
    for (threads, n), ratios in sorted(groups.items()):
        row: list[Any] = [threads, n]
        for measure in MEASURES:
            found = ratios[measure]
            row += [float(np.median(found)) if found else None, sum(r > 1.0 for r in found), len(found)]
        rows.append(row)
    return rows


def trim_rows(data: dict[str, Any]) -> list[list[Any]]:
    """Per library and kind of trim: the cells trimmed per iteration and per fit, and one reason."""
    counts: Counter[tuple[str, str, str]] = Counter()
    example: dict[tuple[str, str], str] = {}
    for c in data["cells"]:
        for lib, result in c["results"].items():
            for measure in MEASURES:
                entry = result.get(f"{measure}_trimmed")
                if entry:
                    counts[(lib, entry["kind"], measure)] += 1
                    example.setdefault(
                        (lib, entry["kind"]),
                        f"{c['covariance_type']} N={c['n']:.0e} D={c['d']} K={c['k']}: {entry['reason']}",
                    )
    pairs = sorted(example)
    return [
        [lib, kind, counts[(lib, kind, "iteration")], counts[(lib, kind, "fit")], example[(lib, kind)]]
        for lib, kind in pairs
    ]


def summary(data: dict[str, Any]) -> str:
    """A few lines: cells, ratios drawn, cells where a peer is ahead, trims by kind."""
    cells = data["cells"]
    lines = [f"{len(cells)} cells"]
    for measure in MEASURES:
        ratios = [c[f"{measure}_ratio"] for c in cells if c.get(f"{measure}_ratio") is not None]
        ahead = sum(r > 1.0 for r in ratios)
        median = float(np.median(ratios)) if ratios else float("nan")
        lines.append(f"per {measure}: {len(ratios)} ratios, median {median:.2f}, a peer ahead in {ahead}")
    for lib, kind, per_iteration, per_fit, _ in trim_rows(data):
        lines.append(f"trimmed {lib} ({kind}): {per_iteration} per iteration, {per_fit} per fit")
    return "\n".join(lines)
