"""The documentation site (issue 41): ``make docs``'s build is clean with warnings as errors,
every public name (each package's ``__all__``) has a reference page, every public callable's
docstring has the numpydoc sections a reference page needs, and their Examples run.

The build (tests/docs_site.py) is shared with the browser test, once a session. The docstring
checks need no build and run in the fast tier; each lists every name that falls short, so one
run says exactly which docstrings are missing what.
"""

from __future__ import annotations

import doctest
import enum
import importlib
import inspect
import json
import re

import nbformat
import pytest
from docs_site import DOCS, ROOT, built_site, public_names, stub_page
from numpydoc.docscrape import ClassDoc, FunctionDoc

PUBLIC = [(package, name) for package, names in public_names().items() for name in names]
DOCTEST_FLAGS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE
TUTORIALS = DOCS / "tutorials"
NOTEBOOKS = ROOT / "notebooks"


def public_object(package: str, name: str) -> object:
    return getattr(importlib.import_module(package), name)


def own_constructor_parameters(cls: type) -> list[str]:
    """The parameters of a class's own ``__init__``/``__new__`` (none when both are inherited
    from outside mixle_nb, an Enum's or a tuple's)."""
    if issubclass(cls, enum.Enum):
        return []
    for owner in cls.__mro__:
        if "__init__" in vars(owner) or "__new__" in vars(owner):
            if not owner.__module__.startswith("mixle_nb"):
                return []
            break
    return named_parameters(cls)


def named_parameters(obj: object) -> list[str]:
    """The parameters of a callable's signature, without ``self``, ``*args`` and ``**kwargs``."""
    kinds = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    return [p.name for p in inspect.signature(obj).parameters.values() if p.kind not in kinds]


def missing_sections(obj: object) -> list[str]:
    """The numpydoc sections the reference page of ``obj`` lacks: Examples for every class and
    function, Parameters where it takes any."""
    if not callable(obj):
        return []
    doc = ClassDoc(obj, config={"show_class_members": False}) if inspect.isclass(obj) else FunctionDoc(obj)
    takes = own_constructor_parameters(obj) if inspect.isclass(obj) else named_parameters(obj)
    missing = []
    if takes and not doc["Parameters"]:
        missing.append("Parameters")
    if not doc["Examples"]:
        missing.append("Examples")
    return missing


@pytest.mark.subprocess
def test_docs_build_with_warnings_as_errors():
    site = built_site()
    warnings = "\n".join(line for line in site.warnings.splitlines() if "WARNING" in line or "ERROR" in line)
    assert site.returncode == 0, f"sphinx-build -W failed ({site.seconds:.0f} s):\n{warnings or site.warnings[-4000:]}"
    assert (site.html / "index.html").exists()


@pytest.mark.subprocess
def test_every_public_name_has_a_reference_page():
    site = built_site()
    without = [
        f"{package}.{name}" for package, name in PUBLIC if not (site.html / f"{stub_page(package, name)}.html").exists()
    ]
    assert not without, f"{len(without)} public names have no reference page: {without}"


def test_every_public_callable_documents_parameters_and_examples():
    short = {
        f"{package}.{name}": missing
        for package, name in PUBLIC
        if (missing := missing_sections(public_object(package, name)))
    }
    listing = "\n".join(f"  {name}: no {' or '.join(missing)}" for name, missing in sorted(short.items()))
    if short:
        pytest.fail(f"{len(short)} of {len(PUBLIC)} public names lack numpydoc sections:\n{listing}", pytrace=False)


CALLABLE = [(package, name) for package, name in PUBLIC if callable(public_object(package, name))]


@pytest.mark.parametrize(("package", "name"), CALLABLE, ids=[f"{p}.{n}" for p, n in CALLABLE])
def test_public_examples_run(package, name):
    """The ``>>>`` examples in the docstrings of a public class or function and its methods,
    those it inherits from mixle_nb's private bases included (they are on its page)."""
    obj = public_object(package, name)
    public = {id(public_object(p, n)) for p, n in PUBLIC}
    private_bases = [
        base
        for base in getattr(obj, "__mro__", ())[1:]
        if base.__module__.startswith("mixle_nb") and id(base) not in public
    ]
    finder = doctest.DocTestFinder(exclude_empty=True)
    tests = [
        test
        for documented in [obj, *private_bases]
        for test in finder.find(documented, f"{package}.{name}", module=inspect.getmodule(documented))
        if test.examples
    ]
    runner = doctest.DocTestRunner(optionflags=DOCTEST_FLAGS)
    report: list[str] = []
    for test in tests:
        runner.run(test, out=report.append)
    assert runner.failures == 0, "".join(report)


def code_cells(notebook: nbformat.NotebookNode) -> list[str]:
    return [cell.source for cell in notebook.cells if cell.cell_type == "code"]


def test_tutorials_are_executed_copies_of_the_notebooks():
    """Each executed copy the site shows has the committed notebook's code, cell for cell, and
    every teaching notebook has one, with its outputs."""
    notebooks = sorted(path.name for path in NOTEBOOKS.glob("*.ipynb"))
    copies = sorted(path.name for path in TUTORIALS.glob("*.ipynb"))
    assert copies == notebooks, "docs/tutorials/ must hold one executed copy of each notebook: run `make tutorials`"
    for name in notebooks:
        copy = nbformat.read(TUTORIALS / name, as_version=4)
        assert code_cells(copy) == code_cells(nbformat.read(NOTEBOOKS / name, as_version=4)), (
            f"docs/tutorials/{name} is out of date with notebooks/{name}: run `make tutorials`"
        )
        assert any(cell.get("outputs") for cell in copy.cells if cell.cell_type == "code"), f"{name}: no outputs"


def test_benchmark_page_shows_every_recorded_result():
    """Every JSON result is on the benchmark page, each in its schema (the peer grid's is its own),
    every result the page names exists, and no table or run on the page is typed by hand."""
    page = (DOCS / "benchmarks.md").read_text(encoding="utf-8")
    shown = set(re.findall(r"```\{benchmark-(?:results|plot)\} (\w+)", page))
    if "```{peer-grid}" in page:
        shown.add("peer_grid")
    recorded = {path.stem for path in (ROOT / "benchmarks" / "results").glob("*.json")}
    assert shown == recorded, f"on the page, not recorded: {shown - recorded}; recorded, not shown: {recorded - shown}"
    for name in recorded:
        record = json.loads((ROOT / "benchmarks" / "results" / f"{name}.json").read_text())
        if name == "peer_grid":
            assert {"schema", "runs", "cells"} <= set(record), name
            assert all({"iteration_ratio", "fit_ratio", "fastest_peer"} <= set(c) for c in record["cells"]), name
        else:
            assert {"command", "date", "threads", "machine", "tables"} <= set(record), name
            assert all(table["rows"] for table in record["tables"]), f"{name}: a table without rows"
    assert not re.search(r"^\|.*\|$", page, re.MULTILINE), "a hand-typed Markdown table on the benchmark page"
    assert not re.search(r"recorded 20\d\d-", page, re.IGNORECASE), "a hand-typed run on the benchmark page"
