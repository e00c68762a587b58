"""The benchmarks' JSON results: one file a benchmark in ``benchmarks/results/``, from which the
documentation's benchmark page is generated (``docs/_ext/benchmark_page.py``).

Each file records what was run (the command line), when (UTC), on what (CPU model, core count,
platform, Python and torch versions, the load average before and after), with how many torch
threads, and the tables the benchmark printed, as columns and rows of numbers or strings.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
LOAD_AT_START = os.getloadavg()


@dataclass
class Table:
    """One table of a benchmark's results: a title, column names and rows."""

    title: str
    columns: list[str]
    rows: list[list[object]] = field(default_factory=list)

    def add(self, *row: object) -> None:
        """Append a row (floats kept to six significant figures); its length must match the columns."""
        if len(row) != len(self.columns):
            raise ValueError(f"{self.title}: a row of {len(row)} values for {len(self.columns)} columns")
        self.rows.append([float(f"{v:.6g}") if isinstance(v, float) else v for v in row])


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo, else the platform's processor string."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def machine() -> dict[str, object]:
    """What the run ran on."""
    import torch

    return {
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
    }


def add_json_argument(parser: argparse.ArgumentParser, name: str) -> None:
    """``--json PATH``: where the results go (default ``benchmarks/results/NAME.json``)."""
    parser.add_argument(
        "--json",
        type=Path,
        default=RESULTS / f"{name}.json",
        help=f"write the results here (default: benchmarks/results/{name}.json, which the docs' benchmark page shows)",
    )


def write_results(path: Path, name: str, threads: int, tables: list[Table]) -> None:
    """Write the run's provenance and tables to ``path`` as JSON, and say where."""
    record = {
        "benchmark": name,
        "command": " ".join(["python", f"benchmarks/{name}.py", *sys.argv[1:]]),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "threads": threads,
        "machine": machine(),
        "load_average": {"start": list(LOAD_AT_START), "end": list(os.getloadavg())},
        "tables": [asdict(table) for table in tables],
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    print(f"results: {path}")
