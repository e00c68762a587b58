"""Every Python example of the README, of the user guide's pages and every ``Example::`` of the
magics' docstrings, run as written, in order, in one real kernel: what a new user pastes first
must work.

The README's cells run first, on the 4-engine cluster its Quick start starts; then the
``python`` blocks of the docs pages in ``DOC_PAGES``, in that order, which continue the Quick
start's session (the pages say so). Their examples that need hosts it cannot reach (ssh and
Slurm in ``docs/guide/hosts-and-schedulers.md``) build the cluster object without starting it,
as written. The shell examples (``make``, ``pip``, ``torchrun``, the benchmarks) are not Python:
the torchrun one is run by notebook 04's test, the benchmarks take minutes. Then the cluster is
stopped (the README says ``%mixle_cluster stop``), the ``%mixle_cluster`` docstring starts a
2-engine one, the other magics' examples run on it, and it is stopped too: no process and no
rendezvous folder may be left behind. (A graceful kernel shutdown with a cluster running is not
tested here: whether the cluster's stop fits in the kernel manager's 5 s grace depends on the
machine's load.)
"""

from __future__ import annotations

import re
import textwrap
import time
import uuid
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient
from test_notebooks import RUN_TAG, describe, tagged_processes

from mixle_nb.magics import MixleMagics

pytestmark = pytest.mark.cluster

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
# The docs pages whose examples run after the README's, in this order (each continues the session).
DOC_PAGES = [
    "docs/guide/handles.md",
    "docs/guide/fitting.md",
    "docs/guide/scikit-learn.md",
    "docs/guide/hmm.md",
    "docs/guide/hosts-and-schedulers.md",
]
MAGICS_IN_ORDER = ["mixle_cluster", "mixle_push", "mixle_scatter", "mixle_pull", "mixle"]


def python_examples(path: Path) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", path.read_text(), flags=re.S | re.M)


def readme_examples() -> list[str]:
    return python_examples(README)


def test_every_docs_page_with_python_examples_is_run():
    """A page that gains a ``python`` block must be added to DOC_PAGES, or its example goes untested."""
    with_examples = {str(p.relative_to(ROOT)) for p in (ROOT / "docs").rglob("*.md") if python_examples(p)}
    assert with_examples == set(DOC_PAGES)


def docstring_example(magic: str) -> str:
    """The indented block after ``Example::`` in the magic's docstring, dedented."""
    doc = getattr(MixleMagics, magic).__doc__
    after = doc.split("Example::\n", 1)[1]
    block = re.match(r"\n*((?:(?: {4,}.*)?\n)+)", after).group(1)
    return textwrap.dedent(block).strip("\n")


def as_cells(example: str) -> list[str]:
    """Notebook cells: a line starting with ``%%`` begins a cell magic, which takes the rest."""
    lines = example.splitlines()
    cut = next((i for i, line in enumerate(lines) if line.startswith("%%")), len(lines))
    return [text for text in ("\n".join(lines[:cut]), "\n".join(lines[cut:])) if text.strip()]


def test_every_readme_docs_and_magic_docstring_example_runs_as_written(tmp_path, monkeypatch):
    tag = uuid.uuid4().hex
    monkeypatch.setenv(RUN_TAG, tag)  # inherited by the kernel and everything it starts
    monkeypatch.setenv("TMPDIR", str(tmp_path))  # where the clusters' rendezvous folders go
    readme = [cell for example in readme_examples() for cell in as_cells(example)]
    docs = [cell for page in DOC_PAGES for example in python_examples(ROOT / page) for cell in as_cells(example)]
    magics = [cell for magic in MAGICS_IN_ORDER for cell in as_cells(docstring_example(magic))]
    assert len(readme) >= 5 and len(readme) + len(docs) >= 11 and len(magics) >= 6
    assert any("%mixle_cluster start 4" in cell for cell in readme) and any("EMPanel(" in cell for cell in readme)
    assert any("from_shards" in cell for cell in docs) and any("%mixle_scatter" in c for c in magics)
    sources = readme + docs + ["%mixle_cluster stop"] + magics + ["%mixle_cluster stop"]
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(source) for source in sources])
    client = NotebookClient(nb, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}})
    client.execute()  # raises CellExecutionError, naming the cell, on any error

    def stdout(source_part: str) -> str:
        cell = next(c for c in nb.cells if source_part in c.source)
        return "".join(o.get("text", "") for o in cell.outputs if o.output_type == "stream" and o.name == "stdout")

    assert stdout("TorchRunEncodedData.from_npy").strip() == "100000 25000"
    assert stdout("from_shards(y").strip() == "10000"
    assert stdout("hx = TorchRunEncodedData.from_shards").strip() == "1000"
    fitted = stdout("result = fit(h, est")  # rank 0's lines only, and only once
    assert fitted.startswith("Iteration 1: log-density") and fitted.count("Iteration 1:") == 1
    assert stdout("print(dist.get_rank(), dist.get_world_size())").strip() == "0 2"

    deadline = time.monotonic() + 20  # the kernel is shutting down; give stragglers a moment
    while (left := tagged_processes(tag)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not left, f"the examples left processes running:\n{describe(left)}"
    assert not list(tmp_path.glob("mixle-rendezvous-*")), "a stopped cluster left its rendezvous folder"
