"""The teaching notebooks: each ``.ipynb`` is paired with a jupytext percent-format ``.py`` (the
text an editor, a linter and a review read), committed stripped and explained, and each runs top
to bottom in a fresh kernel, in time, leaving no process behind (two notebooks run at once, each
in its own kernel, so that the suite uses both cores while one waits).

After editing a notebook in JupyterLab (jupytext keeps the ``.py`` in step on save), strip its
outputs before committing: ``jupyter nbconvert --clear-output --inplace notebooks/NAME.ipynb``
(or edit the ``.py`` and run ``jupytext --sync notebooks/NAME.py``).
"""

from __future__ import annotations

import asyncio
import os
import re
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import jupytext
import nbformat
import psutil
import pytest
from nbclient import NotebookClient

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"
NAMES = [
    "01_em_by_hand.ipynb",
    "02_distributed_em.ipynb",
    "03_streaming_transformer.ipynb",
    "04_from_notebook_to_torchrun.ipynb",
    "05_mixle_hidden_markov.ipynb",
    "06_from_scikit_learn.ipynb",
    "07_hidden_markov.ipynb",
]
STARTS_A_CLUSTER = {
    "02_distributed_em.ipynb",
    "03_streaming_transformer.ipynb",
    "05_mixle_hidden_markov.ipynb",
    "06_from_scikit_learn.ipynb",
    "07_hidden_markov.ipynb",
}
# The longest notebook runs in make test's side lane (marker ``side_lane``): the main lane,
# which holds every other notebook, would otherwise take a minute and a half longer than the side.
SIDE_LANE = {"02_distributed_em.ipynb"}
SUMMARY_CELLS = {"02_distributed_em.ipynb": 3, "03_streaming_transformer.ipynb": 1}
PAIRING = "ipynb,py:percent"
TIME_LIMIT_S = 180  # the "under 3 minutes on this 2-core machine"
RUN_TAG = "MIXLE_NB_NOTEBOOK_RUN"


def read(name: str) -> nbformat.NotebookNode:
    return nbformat.read(NOTEBOOKS / name, as_version=4)


def text_source(name: str) -> Path:
    return NOTEBOOKS / name.replace(".ipynb", ".py")


def words(text: str) -> int:
    return len(re.findall(r"[A-Za-z]{2,}", text))


@pytest.mark.parametrize("name", NAMES)
def test_committed_notebook_is_valid_stripped_and_explained(name):
    nb = read(name)
    nbformat.validate(nb)
    assert "widgets" not in nb.metadata, "the committed notebook carries widget state: strip it"
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        assert cell.outputs == [] and cell.execution_count is None, (
            f"{name} cell {i} has outputs: jupyter nbconvert --clear-output --inplace notebooks/{name}"
        )
        before = nb.cells[i - 1] if i else None
        assert before is not None and before.cell_type == "markdown" and words(before.source) >= 3, (
            f"{name} cell {i} is not preceded by a markdown sentence saying what it shows:\n{cell.source}"
        )
    tagged = [c for c in nb.cells if "summary" in c.metadata.get("tags", [])]
    assert len(tagged) == SUMMARY_CELLS.get(name, 0)
    assert all(c.cell_type == "code" and "print(" in c.source for c in tagged)


def test_every_notebook_is_listed_and_has_its_text_source():
    on_disk = sorted(p.name for p in NOTEBOOKS.glob("*.ipynb"))
    assert on_disk == sorted(NAMES), "a notebook in notebooks/ is missing from NAMES, or the reverse"
    assert sorted(RUN_ORDER) == sorted(NAMES), "a notebook is missing from RUN_ORDER, or the reverse"
    for name in NAMES:
        assert text_source(name).is_file(), f"{name} has no paired {text_source(name).name}"
        # plain Python (magics are comments), so editors and linters read it
        compile(text_source(name).read_text(), str(text_source(name)), "exec")


def cells(nb: nbformat.NotebookNode) -> list[tuple[str, str, list]]:
    """What a reader sees: each cell's type, source and tags (ids and outputs aside)."""
    return [(c.cell_type, c.source, c.metadata.get("tags", [])) for c in nb.cells]


@pytest.mark.parametrize("name", NAMES)
def test_notebook_and_its_text_source_agree(name):
    nb = read(name)
    text = jupytext.read(text_source(name), fmt="py:percent")
    for which, notebook in ((name, nb), (text_source(name).name, text)):
        formats = notebook.metadata.get("jupytext", {}).get("formats")
        assert formats == PAIRING, f"{which} is not paired (jupytext formats {formats!r}, want {PAIRING!r})"
    assert notebook_kernel(text) == notebook_kernel(nb)
    assert cells(text) == cells(nb), (
        f"{name} and {text_source(name).name} differ: run jupytext --sync {text_source(name)} "
        "(the newer file wins), then strip the notebook's outputs"
    )


def notebook_kernel(nb: nbformat.NotebookNode) -> str | None:
    return nb.metadata.get("kernelspec", {}).get("name")


def test_jupyterlab_saves_and_opens_through_the_pair(tmp_path):
    """What JupyterLab does with jupytext's server extension (installed with jupytext): saving
    the notebook rewrites its ``.py``, and opening it after an edit of the ``.py`` shows the edit."""
    from jupyter_server.services.contents.filemanager import FileContentsManager
    from jupytext.sync_contentsmanager import build_sync_jupytext_contents_manager_class

    name = NAMES[0]
    for path in (NOTEBOOKS / name, text_source(name)):
        (tmp_path / path.name).write_bytes(path.read_bytes())
    manager = build_sync_jupytext_contents_manager_class(FileContentsManager)(root_dir=str(tmp_path))
    pair = tmp_path / text_source(name).name

    model = manager.get(name)
    model["content"]["cells"][0]["source"] += "\n\nSaved from JupyterLab."
    manager.save(model, name)
    assert "# Saved from JupyterLab." in pair.read_text()
    assert cells(jupytext.read(pair, fmt="py:percent")) == cells(nbformat.read(tmp_path / name, as_version=4))

    time.sleep(1.1)  # an edit after the save, even where file times have a one-second grain
    pair.write_text(pair.read_text().replace("# Saved from JupyterLab.", "# Edited in an editor."))
    opened = manager.get(name)["content"]
    assert opened["cells"][0]["source"].endswith("Edited in an editor.")


def tagged_processes(tag: str) -> list[psutil.Process]:
    """Live processes whose environment carries ``tag``: the kernel and everything it started
    (engines, controller, torchrun workers), even after they are orphaned. Processes of other
    runs (a concurrent test session, a notebook server) never carry it."""
    found = []
    for proc in psutil.process_iter(["pid"]):
        if proc.pid == os.getpid():
            continue
        try:
            if proc.environ().get(RUN_TAG) == tag and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            pass
    return found


def describe(procs: list[psutil.Process]) -> str:
    lines = []
    for proc in procs:
        try:
            lines.append(f"{proc.pid}: {' '.join(proc.cmdline())[:160]}")
        except psutil.Error:
            pass
    return "\n".join(lines)


@dataclass
class NotebookRun:
    """One notebook executed in its own fresh kernel: the executed notebook, its run time, and
    what of its processes was still alive 20 s after its kernel shut down."""

    nb: nbformat.NotebookNode
    elapsed: float
    left: str


def run_in_fresh_kernel(name: str) -> NotebookRun:
    """Execute ``name`` in a kernel of its own, tagged so that its processes can be found."""
    tag = uuid.uuid4().hex
    # inherited by the kernel and every process it starts; notebook 03 trains 45 s for a reader
    env = {**os.environ, RUN_TAG: tag, "MIXLE_NB_TRAIN_BUDGET_S": "5"}
    nb = read(name)
    client = NotebookClient(
        nb,
        timeout=300,
        kernel_name="python3",
        store_widget_state=True,
        resources={"metadata": {"path": str(NOTEBOOKS)}},
    )
    started = time.monotonic()
    asyncio.run(client.async_execute(env=env))  # raises CellExecutionError, naming the cell, on any error
    elapsed = time.monotonic() - started
    deadline = time.monotonic() + 20  # the kernel is shutting down; give stragglers a moment
    while (left := tagged_processes(tag)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return NotebookRun(nb, elapsed, describe(left))


# The order the two lanes take the notebooks in: a notebook with a cluster beside one without
# (two 4-engine clusters at once only contend for the cores), the longest first.
RUN_ORDER = [
    "05_mixle_hidden_markov.ipynb",
    "01_em_by_hand.ipynb",
    "03_streaming_transformer.ipynb",
    "04_from_notebook_to_torchrun.ipynb",
    "07_hidden_markov.ipynb",
    "02_distributed_em.ipynb",
    "06_from_scikit_learn.ipynb",
]


@pytest.fixture(scope="module")
def notebook_runs(request: pytest.FixtureRequest) -> Iterator[dict[str, Future[NotebookRun]]]:
    """The selected notebooks, each in its own fresh kernel, two at a time (a notebook's kernel
    often waits on its engines, or its engines on the kernel: two keep both cores busy)."""
    selected = {
        item.callspec.params["name"]
        for item in request.session.items
        if item.originalname == "test_notebook_runs_top_to_bottom_in_a_fresh_kernel"
    }
    lanes = ThreadPoolExecutor(max_workers=2, thread_name_prefix="notebook")
    try:
        yield {name: lanes.submit(run_in_fresh_kernel, name) for name in RUN_ORDER if name in selected}
    finally:  # after a stop at the first failure (-x), the notebooks not yet started never start
        lanes.shutdown(wait=True, cancel_futures=True)


@pytest.mark.kernel
@pytest.mark.parametrize(
    "name",
    [
        pytest.param(
            n,
            marks=[
                m
                for m, on in ((pytest.mark.cluster, n in STARTS_A_CLUSTER), (pytest.mark.side_lane, n in SIDE_LANE))
                if on
            ],
        )
        for n in NAMES
    ],
)
def test_notebook_runs_top_to_bottom_in_a_fresh_kernel(name, notebook_runs):
    run = notebook_runs[name].result()  # raises the notebook's CellExecutionError, naming the cell
    errors = [o for c in run.nb.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]
    assert not errors
    assert run.elapsed < TIME_LIMIT_S, f"{name} took {run.elapsed:.0f} s; the limit is {TIME_LIMIT_S} s"
    assert not run.left, f"{name} left processes running:\n{run.left}"
    for cell in run.nb.cells:
        if "summary" in cell.metadata.get("tags", []):
            assert any(o.output_type == "stream" and o.name == "stdout" for o in cell.outputs)
