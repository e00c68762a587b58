"""``mixle_nb.__version__`` is the installed distribution's version, which is pyproject.toml's:
the version is written in one place."""

from __future__ import annotations

import sys
from importlib.metadata import version
from pathlib import Path

import mixle_nb

if sys.version_info >= (3, 11):
    import tomllib
else:  # pytest itself depends on tomli before 3.11
    import tomli as tomllib

PYPROJECT = Path(__file__).resolve().parent.parent / "pyproject.toml"


def test_version_is_the_one_in_pyproject():
    declared = tomllib.loads(PYPROJECT.read_text())["project"]["version"]
    assert version("mixle_nb") == declared, (
        f"the installed mixle_nb is {version('mixle_nb')}, pyproject.toml says {declared}: reinstall (make venv)"
    )
    assert mixle_nb.__version__ == declared


def test_version_is_not_written_in_the_source():
    init = Path(mixle_nb.__file__).read_text()
    assert f'"{mixle_nb.__version__}"' not in init and f"'{mixle_nb.__version__}'" not in init
