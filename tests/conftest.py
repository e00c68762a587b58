"""Shared fixtures: one 2-engine MixleCluster for the whole session (starting one costs seconds),
and the fast tier's guard (tests/fast_tier.py): under a ``-m`` that deselects every process
marker, starting such a process fails the test that did, naming the marker it lacks."""

from __future__ import annotations

import os

import pytest
from fast_tier import FIXTURE_MARKERS, PROCESS_MARKERS, Guard, starts_nothing

# Engines are child processes and inherit this: functions defined in test modules pickle by
# reference (module + name), so the engines must be able to import those modules.
_TESTS = os.path.dirname(os.path.abspath(__file__))
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [_TESTS, os.environ.get("PYTHONPATH")]))

_guard: Guard | None = None


def pytest_configure(config: pytest.Config) -> None:
    global _guard
    if starts_nothing(config):
        _guard = Guard(PROCESS_MARKERS)
        _guard.install()


def pytest_unconfigure(config: pytest.Config) -> None:
    if _guard is not None:
        _guard.uninstall()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    if _guard is not None:
        _guard.test = item.nodeid


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """A test using a fixture that starts processes must carry that fixture's marker."""
    unmarked = []
    for item in items:
        marks = {m.name for m in item.iter_markers()}
        for fixture in getattr(item, "fixturenames", ()):
            needed = FIXTURE_MARKERS.get(fixture)
            if needed and needed not in marks:
                unmarked.append(f"{item.nodeid} uses the fixture {fixture!r} without @pytest.mark.{needed}")
    if unmarked:
        raise pytest.UsageError("tests that start processes without their marker:\n" + "\n".join(unmarked))


@pytest.fixture(scope="session")
def cluster2():
    """A running 2-engine MixleCluster (gloo, 20 s collective timeout), stopped at session end.

    Tests must leave it running; a test that breaks it must ``restart()`` it.
    """
    from mixle_nb.cluster import MixleCluster

    cluster = MixleCluster(2, timeout=20.0)
    cluster.start()
    yield cluster
    cluster.stop()
