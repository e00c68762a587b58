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
"""

from __future__ import annotations

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


def setup(app: Sphinx) -> dict[str, object]:
    """Register the two directives."""
    app.add_directive("benchmark-results", BenchmarkResults)
    app.add_directive("benchmark-plot", BenchmarkPlot)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
