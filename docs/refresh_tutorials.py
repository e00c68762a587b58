"""Refresh the tutorials the site shows (``make tutorials``): run each teaching notebook of
``notebooks/`` headlessly in a fresh kernel (as ``make demo`` does) and keep the executed copy in
``docs/tutorials/``, so the site shows the notebooks with their outputs and pictures without
running anything at build time.

The panels' live widgets need a kernel (or JavaScript from a CDN, which the offline site does not
load), so a copy keeps each widget output's text form and drops the stored widget state; the
panels' pictures are on the user guide's panel page.

Run from the repository root: ``python docs/refresh_tutorials.py [NAME.ipynb ...]``.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import nbformat

from mixle_nb.demo import NOTEBOOKS, execute

TUTORIALS = Path(__file__).resolve().parent / "tutorials"
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"


def without_widgets(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """The notebook without its stored widget state and widget views (their text form stays)."""
    nb.metadata.pop("widgets", None)
    for cell in nb.cells:
        for output in cell.get("outputs", []):
            output.get("data", {}).pop(WIDGET_VIEW, None)
    return nb


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebooks", nargs="*", help="notebooks in notebooks/ (default: all)")
    args = parser.parse_args(argv)
    names = args.notebooks or sorted(path.name for path in NOTEBOOKS.glob("*.ipynb"))
    for name in names:
        start = time.perf_counter()
        nb = without_widgets(execute(NOTEBOOKS / name))
        nbformat.write(nb, TUTORIALS / name)
        print(f"{name}: executed in {time.perf_counter() - start:.0f} s -> {TUTORIALS / name}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
