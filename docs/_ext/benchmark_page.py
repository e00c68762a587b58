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
    The peer grid of ``benchmarks/peer_grid.py``, which keeps its own schema (a grid of cells
    added to slice by slice, in its docstring): the runs' provenance, one table per iteration and
    one per whole fit (each library's time, ours over the fastest peer's), the grid search, and
    the heat map, drawn at build time by the script's own ``plot``.
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


def peer_grid_provenance(grid: dict[str, Any]) -> str:
    """One sentence: the runs' dates, commits, machine, library versions and load averages."""
    runs = grid["runs"]
    loads = [run["load"][0] for run in runs]
    commits = sorted({run["git"][:10] for run in runs})
    versions = ", ".join(f"{name} {v}" for name, v in runs[-1]["versions"].items())
    return (
        f"Recorded in {len(runs)} slices from {runs[0]['date']} to {runs[-1]['date']} by "
        f"`python benchmarks/peer_grid.py` (the slices' options are not recorded) on {runs[-1]['machine']} "
        f"({runs[-1]['cpus']} cores) at commits {', '.join(commits)}; {versions}; one-minute load average "
        f"{min(loads):.1f} to {max(loads):.1f} at the slices' starts."
    )


def peer_grid_table(grid: dict[str, Any], what: str) -> dict[str, Any]:
    """Per cell, each library's time (ms an ``iteration`` or s a ``fit``) and ours over the fastest peer's."""
    unit, key, scale = ("ms", "iteration_s", 1e3) if what == "iteration" else ("s", "fit_s", 1.0)
    before = any(PEER_GRID_BEFORE in cell["results"] for cell in grid["cells"])
    libraries = [*PEER_GRID_LIBRARIES, *([PEER_GRID_BEFORE] if before else [])]
    rows = []
    for cell in sorted(grid["cells"], key=lambda c: (c["covariance_type"], c["d"], c["k"], c["threads"], c["n"])):
        times = []
        for library in libraries:
            result = cell["results"].get(library, {})
            times.append(scale * result[key] if key in result else ("trimmed" if "trimmed" in result else None))
        ratio = cell[f"{what}_ratio"]
        rows.append(
            [
                cell["covariance_type"],
                cell["d"],
                cell["k"],
                cell["threads"],
                f"{cell['n']:.0e}".replace("e+0", "e"),
                *times,
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


def peer_grid_plot(grid: dict[str, Any], target: Path) -> None:
    """Draw the heat map to ``target`` with ``benchmarks/peer_grid.py``'s own ``plot``."""
    spec = importlib.util.spec_from_file_location("peer_grid", RESULTS.parent / "peer_grid.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    target.parent.mkdir(exist_ok=True)
    module.plot(grid, target)


class PeerGrid(SphinxDirective):
    """``peer-grid``: the provenance, the per-iteration and whole-fit tables and the heat map of the peer grid."""

    def run(self) -> list[nodes.Node]:
        grid = load(self, "peer_grid")
        paragraph, messages = self.state.inline_text(peer_grid_provenance(grid), self.lineno)
        out: list[nodes.Node] = [nodes.paragraph("", "", *paragraph, classes=["benchmark-provenance"]), *messages]
        out += [table_node(peer_grid_table(grid, what)) for what in ("iteration", "fit")]
        search = grid.get("grid_search")
        if search:
            seconds = search["seconds"]
            out.append(
                table_node(
                    {
                        "title": "GridSearchCV(GaussianMixture(), {'n_components': range(1, 9)}, cv=5), N = 1,000, "
                        f"D = 2, recorded {grid['runs'][search['run']]['date']}",
                        "columns": [
                            "threads",
                            "mixle_nb s",
                            "scikit-learn s",
                            "ours / scikit-learn's",
                            *([f"{PEER_GRID_BEFORE} s"] if PEER_GRID_BEFORE in seconds else []),
                        ],
                        "rows": [
                            [
                                search["threads"],
                                seconds["mixle_nb"],
                                seconds["scikit-learn"],
                                seconds["mixle_nb"] / seconds["scikit-learn"],
                                *([seconds[PEER_GRID_BEFORE]] if PEER_GRID_BEFORE in seconds else []),
                            ]
                        ],
                    }
                )
            )
        file = "peer_grid.png"
        peer_grid_plot(grid, Path(self.env.srcdir) / GENERATED / file)
        image = nodes.image(uri=f"/{GENERATED}/{file}", alt="mixle_nb over the fastest peer per cell")
        figure = nodes.figure("", image, classes=["benchmark-plot"])
        figure += nodes.caption(text="mixle_nb's time over the fastest peer's per cell (below 1, blue: ahead)")
        out.append(figure)
        return out


def setup(app: Sphinx) -> dict[str, object]:
    """Register the three directives."""
    app.add_directive("benchmark-results", BenchmarkResults)
    app.add_directive("benchmark-plot", BenchmarkPlot)
    app.add_directive("peer-grid", PeerGrid)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
