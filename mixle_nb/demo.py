"""The main job (``make demo``): run the distributed-EM and streaming-training notebooks
headlessly in a real kernel, write executed notebooks and HTML reports to ``out/``, and print
a short summary (the text of every cell tagged ``summary``).

Run from the repository root: ``python -m mixle_nb.demo [--out out] [notebook ...]``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

try:
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError
    from nbconvert import HTMLExporter
    from nbformat.sign import NotebookNotary
except ImportError as missing:  # the demo's tools are an extra, not runtime dependencies
    raise SystemExit(
        f"the demo needs {missing.name}, from the demo extra: pip install -e '.[demo]' (or run `make demo`)"
    ) from missing

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"
DEFAULT = ("02_distributed_em.ipynb", "03_streaming_transformer.ipynb")


def execute(path: Path, timeout: float = 600) -> nbformat.NotebookNode:
    """Execute a notebook in a fresh kernel with its own folder as the working directory,
    storing widget state so the panels render again when the notebook is opened."""
    nb = nbformat.read(path, as_version=4)
    NotebookClient(
        nb,
        timeout=timeout,
        kernel_name="python3",
        store_widget_state=True,
        resources={"metadata": {"path": str(path.parent)}},
    ).execute()
    return nb


def summary_lines(nb: nbformat.NotebookNode) -> list[str]:
    """Printed text of the cells tagged ``summary``."""
    lines = []
    for cell in nb.cells:
        if "summary" in cell.get("metadata", {}).get("tags", []):
            for output in cell.get("outputs", []):
                if output.get("output_type") == "stream" and output.get("name") == "stdout":
                    lines.extend(output["text"].rstrip("\n").splitlines())
    return lines


def write_reports(nb: nbformat.NotebookNode, name: str, out: Path) -> tuple[Path, Path]:
    """The executed notebook (signed as trusted, so Lab renders its stored widgets) and HTML."""
    out.mkdir(parents=True, exist_ok=True)
    NotebookNotary().sign(nb)
    executed = out / name
    nbformat.write(nb, executed)
    html, _ = HTMLExporter().from_notebook_node(nb)
    report = executed.with_suffix(".html")
    report.write_text(html, encoding="utf-8")
    return executed, report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebooks", nargs="*", default=list(DEFAULT), help="notebooks in notebooks/")
    parser.add_argument("--out", type=Path, default=Path("out"), help="folder for the reports")
    args = parser.parse_args(argv)
    for name in args.notebooks:
        path = NOTEBOOKS / name
        if not path.exists():
            parser.error(f"{path} does not exist; choose from {sorted(p.name for p in NOTEBOOKS.glob('*.ipynb'))}")
        print(f"== {name}: running in a fresh kernel ...", flush=True)
        t0 = time.perf_counter()
        try:
            nb = execute(path)
        except CellExecutionError as exc:
            print(f"{name} failed:\n{exc}", file=sys.stderr)
            return 1
        executed, report = write_reports(nb, name, args.out)
        for line in summary_lines(nb):
            print(f"   {line}")
        print(f"   done in {time.perf_counter() - t0:.0f} s -> {report} (executed notebook: {executed})", flush=True)
    print(f"Reports are in {args.out.resolve()}/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
