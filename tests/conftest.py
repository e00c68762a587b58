"""Shared fixtures: one 2-engine MixleCluster for the whole session (starting one costs seconds)."""

import os

import pytest

# Engines are child processes and inherit this: functions defined in test modules pickle by
# reference (module + name), so the engines must be able to import those modules.
_TESTS = os.path.dirname(os.path.abspath(__file__))
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [_TESTS, os.environ.get("PYTHONPATH")]))


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
