"""Sphinx extension: the benchmark page's tables and plots, read from ``benchmarks/results/``.

Every benchmark writes its results as JSON (``benchmarks/results.py``): the command, the UTC
date, the machine, the torch threads, the load average and its tables. Two directives put them on
a page, so that no number there is typed by hand:

``benchmark-results NAME``
    The run's provenance line and its tables (``:tables: 0 2`` for some of them).
``benchmark-plot NAME``
    A grouped bar chart of one table (``:table:``), one group a row labelled by the ``:label:``
    columns, one bar a ``:columns:`` value (``:log:`` for a logarithmic axis), drawn with
    matplotlib at build time into ``_generated/``.

``peer-grid``
    The peer grid of ``benchmarks/peer_grid.py``, which keeps its own schema (a grid of cells,
    in its docstring): the runs' provenance, a heat map per thread count (drawn at build time by
    ``benchmarks/peer_grid_report.py``), the cells where a peer is ahead, the trims, the grid
    search, and one table per iteration and one per whole fit (each library's time, ours over
    the fastest peer's).
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

from docutils import nodes
from docutils.parsers.rst import directives
from sphinx.application import Sphinx
from sphinx.util.docutils import SphinxDirective

RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results"
GENERATED = "_generated"


def load(directive: SphinxDirective, name: str) -> dict[str, Any]:
    """The JSON record of benchmark ``name``, noted as a dependency of the page."""
    path = RESULTS / f"{name}.json"
    if not path.exists():
        raise directive.error(f"{path} does not exist: run benchmarks/{name}.py to record it")
    directive.env.note_dependency(str(path))
    return json.loads(path.read_text(encoding="utf-8"))


def shown(value: object) -> str:
    """A cell's text: three significant figures for measurements, as they are for labels."""
    if value is None:
        return "–"
    if isinstance(value, bool) or not isinstance(value, float):
        return str(value)
    size = abs(value)
    if size == 0:
        return "0"
    if size < 1e-3:
        return f"{value:.1e}"
    if size >= 100:
        return f"{value:,.0f}"
    return f"{value:.3g}"


def provenance(record: dict[str, Any]) -> str:
    """One sentence: when, what command, on what machine, with what threads and load."""
    machine = record["machine"]
    load_start = record["load_average"]["start"][0]
    load_end = record["load_average"]["end"][0]
    return (
        f"Recorded {record['date']} by `{record['command']}` on {machine['cpu']} ({machine['cores']} cores, "
        f"{machine['platform']}; Python {machine['python']}, torch {machine['torch']}), "
        f"{record['threads']} torch thread(s) a process, one-minute load average {load_start:.1f} at the start "
        f"and {load_end:.1f} at the end."
    )


def table_node(table: dict[str, Any]) -> nodes.table:
    """A docutils table of one result table, titled."""
    columns = table["columns"]
    group = nodes.tgroup(cols=len(columns))
    group += [nodes.colspec(colwidth=1) for _ in columns]
    head = nodes.thead()
    head += row_node(columns)
    body = nodes.tbody()
    body += [row_node([shown(v) for v in row]) for row in table["rows"]]
    group += [head, body]
    node = nodes.table(classes=["benchmark-table"])
    node += nodes.title(text=table["title"])
    node += group
    return node


def row_node(cells: list[str]) -> nodes.row:
    """A table row of text cells."""
    row = nodes.row()
    for text in cells:
        entry = nodes.entry()
        entry += nodes.paragraph(text=text)
        row += entry
    return row


def names(argument: str | None) -> list[str]:
    """A comma-separated option as a list of stripped names."""
    return [part.strip() for part in (argument or "").split(",") if part.strip()]


class BenchmarkResults(SphinxDirective):
    """``benchmark-results NAME``: the provenance and tables of one benchmark's JSON."""

    required_arguments = 1
    option_spec = {"tables": directives.positive_int_list}

    def run(self) -> list[nodes.Node]:
        name = self.arguments[0]
        record = load(self, name)
        wanted = self.options.get("tables", range(len(record["tables"])))
        paragraph, messages = self.state.inline_text(provenance(record), self.lineno)
        out: list[nodes.Node] = [nodes.paragraph("", "", *paragraph, classes=["benchmark-provenance"]), *messages]
        out += [table_node(record["tables"][i]) for i in wanted]
        return out


class BenchmarkPlot(SphinxDirective):
    """``benchmark-plot NAME``: a grouped bar chart of one table of a benchmark's JSON."""

    required_arguments = 1
    option_spec = {
        "table": directives.nonnegative_int,
        "label": directives.unchanged_required,
        "columns": directives.unchanged_required,
        "ylabel": directives.unchanged,
        "log": directives.flag,
    }

    def run(self) -> list[nodes.Node]:
        name = self.arguments[0]
        index = self.options.get("table", 0)
        table = load(self, name)["tables"][index]
        file = f"{name}_{index}.png"
        target = Path(self.env.srcdir) / GENERATED / file
        draw(table, names(self.options["label"]), names(self.options["columns"]), self.options, target)
        image = nodes.image(uri=f"/{GENERATED}/{file}", alt=table["title"])
        figure = nodes.figure("", image, classes=["benchmark-plot"])
        figure += nodes.caption(text=table["title"])
        return [figure]


def draw(table: dict[str, Any], label: list[str], columns: list[str], options: dict[str, Any], target: Path) -> None:
    """Draw the grouped bars of ``columns`` for each row of ``table`` to ``target``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    heads = table["columns"]
    missing = [c for c in label + columns if c not in heads]
    if missing:
        raise ValueError(f"{table['title']}: no column {missing}; the columns are {heads}")
    groups = [" ".join(str(row[heads.index(c)]) for c in label) for row in table["rows"]]
    width = 0.8 / len(columns)
    figure, axes = plt.subplots(figsize=(7, 3.2), layout="constrained")
    for i, column in enumerate(columns):
        values = [row[heads.index(column)] for row in table["rows"]]
        axes.bar([g + i * width for g in range(len(groups))], [v or 0 for v in values], width, label=column)
    axes.set_xticks([g + width * (len(columns) - 1) / 2 for g in range(len(groups))], groups)
    axes.set_ylabel(options.get("ylabel") or "")
    if "log" in options:
        axes.set_yscale("log")
    axes.legend(frameon=False)
    target.parent.mkdir(exist_ok=True)
    figure.savefig(target, dpi=100)
    plt.close(figure)


PEER_GRID_LIBRARIES = ("mixle_nb", "scikit-learn", "pomegranate", "torchgmm")
# peer_grid.py --baseline's contender: an earlier commit's mixle_nb, a column where recorded
PEER_GRID_BEFORE = "mixle_nb before"


def peer_grid_report() -> Any:
    """``benchmarks/peer_grid_report.py`` (heat maps, the cells a peer is ahead in, the trims),
    loaded from its file: it needs numpy and matplotlib only."""
    spec = importlib.util.spec_from_file_location("peer_grid_report", RESULTS.parent / "peer_grid_report.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def peer_grid_provenance(grid: dict[str, Any]) -> str:
    """One sentence a run: its command, dates, commit, machine, versions and load averages."""
    sentences = []
    for run in grid["runs"]:
        versions = ", ".join(f"{name} {v}" for name, v in run["versions"].items())
        ended = f" to {run['end']} ({run['elapsed_s']:.0f} s)" if "end" in run else ""
        load_end = f" and {run['load_end'][0]:.1f} at its end" if "load_end" in run else ""
        sentences.append(
            f"Recorded from {run['date']}{ended} by `{run.get('command', 'python benchmarks/peer_grid.py')}` on "
            f"{run['machine']} ({run['cpus']} cores) at commit {run['git'][:10]}; {versions}; one-minute load "
            f"average {run['load'][0]:.1f} at its start{load_end}."
        )
    return " ".join(sentences)


def peer_grid_entry(result: dict[str, Any], what: str, scale: float) -> object:
    """A library's time in a cell (scaled), or why there is none: its trim's kind, or failed."""
    if f"{what}_s" in result:
        return scale * result[f"{what}_s"]
    if f"{what}_trimmed" in result:
        return f"trimmed ({result[f'{what}_trimmed']['kind']})"
    if f"{what}_failed" in result or "failed" in result:
        return "failed"
    return None


def peer_grid_table(grid: dict[str, Any], what: str) -> dict[str, Any]:
    """Per cell, each library's time (ms an ``iteration`` or s a ``fit``) and ours over the fastest peer's."""
    unit, scale = ("ms", 1e3) if what == "iteration" else ("s", 1.0)
    before = any(PEER_GRID_BEFORE in cell["results"] for cell in grid["cells"])
    libraries = [*PEER_GRID_LIBRARIES, *([PEER_GRID_BEFORE] if before else [])]
    rows = []
    for cell in sorted(grid["cells"], key=lambda c: (c["covariance_type"], c["d"], c["k"], c["threads"], c["n"])):
        ratio = cell[f"{what}_ratio"]
        rows.append(
            [
                cell["covariance_type"],
                cell["d"],
                cell["k"],
                cell["threads"],
                f"{cell['n']:.0e}".replace("e+0", "e"),
                *(peer_grid_entry(cell["results"].get(library, {}), what, scale) for library in libraries),
                ratio,
                cell["fastest_peer"][what] if ratio is not None else None,
                *([(cell.get("before_ratio") or {}).get(what)] if before else []),
            ]
        )
    title = "Per EM iteration (the difference of two fits over their extra iterations; at or below 0: noise)"
    if what == "fit":
        title = "Whole fit with each library's defaults (its own start and stopping rule)"
    return {
        "title": title,
        "columns": [
            "covariance",
            "D",
            "K",
            "threads",
            "N",
            *(f"{library} {unit}" for library in libraries),
            "ours / fastest peer",
            "fastest peer",
            *(["ours / before"] if before else []),
        ],
        "rows": rows,
    }


def peer_grid_ahead_table(grid: dict[str, Any], report: Any) -> dict[str, Any]:
    """The cells where a peer is still ahead of us, from the JSON."""
    rows = [
        [threads, cov, d, k, f"{n:.0e}".replace("e+0", "e"), what, ratio, peer, 1e3 * ours, 1e3 * theirs]
        for threads, cov, d, k, n, what, ratio, peer, ours, theirs in report.ahead_rows(grid)
    ]
    return {
        "title": f"The cells where a peer is ahead ({len(rows)}; ours / fastest peer above 1)",
        "columns": ["threads", "covariance", "D", "K", "N", "measure", "ours / peer", "peer", "ours ms", "peer ms"],
        "rows": rows or [["–"] * 10],
    }


def peer_grid_median_table(grid: dict[str, Any], report: Any) -> dict[str, Any]:
    """Per thread count and N, the median of ours over the fastest peer and the cells a peer leads."""
    return {
        "title": "Ours over the fastest peer by thread count and N: the median of the cells measured",
        "columns": [
            "threads",
            "N",
            "per iteration, median",
            "peer ahead",
            "cells",
            "per fit, median",
            "peer ahead",
            "cells",
        ],
        "rows": [[threads, f"{n:.0e}".replace("e+0", "e"), *rest] for threads, n, *rest in report.median_rows(grid)],
    }


def peer_grid_trims_table(grid: dict[str, Any], report: Any) -> dict[str, Any]:
    """What was trimmed, per library and kind, with one reason of each (all are in the JSON)."""
    return {
        "title": "Trimmed: cells per library and kind of trim (peer_grid.py's docstring and grid_trims.py say the rules)",
        "columns": ["library", "kind", "per iteration", "per fit", "for example"],
        "rows": report.trim_rows(grid) or [["–"] * 5],
    }


def peer_grid_search_table(grid: dict[str, Any]) -> dict[str, Any]:
    """``GridSearchCV`` over ``n_components`` 1-8, ours against scikit-learn's, per thread count."""
    searches = grid.get("grid_search", [])
    before = any(PEER_GRID_BEFORE in search["seconds"] for search in searches)
    rows = []
    for search in searches:
        seconds = search["seconds"]
        rows.append(
            [
                search["threads"],
                grid["runs"][search["run"]]["date"],
                seconds["mixle_nb"],
                seconds["scikit-learn"],
                seconds["mixle_nb"] / seconds["scikit-learn"]
                if seconds["mixle_nb"] and seconds["scikit-learn"]
                else None,
                *([seconds.get(PEER_GRID_BEFORE)] if before else []),
            ]
        )
    return {
        "title": "GridSearchCV(GaussianMixture(), {'n_components': range(1, 9)}, cv=5), N = 1,000, D = 2",
        "columns": [
            "threads",
            "recorded",
            "mixle_nb s",
            "scikit-learn s",
            "ours / scikit-learn's",
            *([f"{PEER_GRID_BEFORE} s"] if before else []),
        ],
        "rows": rows,
    }


class PeerGrid(SphinxDirective):
    """``peer-grid``: the provenance, a heat map per thread count, the cells a peer is ahead in,
    the trims, the grid search, and the per-iteration and whole-fit tables of the peer grid."""

    def run(self) -> list[nodes.Node]:
        grid = load(self, "peer_grid")
        report = peer_grid_report()
        paragraph, messages = self.state.inline_text(peer_grid_provenance(grid), self.lineno)
        out: list[nodes.Node] = [nodes.paragraph("", "", *paragraph, classes=["benchmark-provenance"]), *messages]
        stem = Path(self.env.srcdir) / GENERATED / "peer_grid"
        stem.parent.mkdir(exist_ok=True)
        for path in report.plot_all(grid, stem):
            image = nodes.image(uri=f"/{GENERATED}/{path.name}", alt=f"mixle_nb over the fastest peer, {path.stem}")
            figure = nodes.figure("", image, classes=["benchmark-plot"])
            figure += nodes.caption(
                text=f"{path.stem.split('_')[-1].replace('thread', ' thread(s)')}: mixle_nb's time over the fastest "
                "peer's per cell (below 1, blue: ahead; framed: a peer ahead; hatched: trimmed, labelled with why)"
            )
            out.append(figure)
        out.append(table_node(peer_grid_median_table(grid, report)))
        out.append(table_node(peer_grid_ahead_table(grid, report)))
        out.append(table_node(peer_grid_trims_table(grid, report)))
        if grid.get("grid_search"):
            out.append(table_node(peer_grid_search_table(grid)))
        out += [table_node(peer_grid_table(grid, what)) for what in ("iteration", "fit")]
        return out


def setup(app: Sphinx) -> dict[str, object]:
    """Register the three directives."""
    app.add_directive("benchmark-results", BenchmarkResults)
    app.add_directive("benchmark-plot", BenchmarkPlot)
    app.add_directive("peer-grid", PeerGrid)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
