"""The documentation site for the tests: one Sphinx build per test session, shared by
``tests/test_docs_site.py`` and ``tests/browser/test_docs_site_pages.py``, and the public names the
API reference must cover.

The build is ``make docs``'s (``-W --keep-going -n``: any warning fails it), from scratch (``-E``,
fresh doctrees, so every page's warnings are seen), into a temporary folder removed at exit.
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
sys.path.insert(0, str(DOCS / "_ext"))

from api_pages import public_names, stub_page  # noqa: E402

BUILD_TIMEOUT_S = 300  # the limit for `make docs`
_folders: list[tempfile.TemporaryDirectory] = []  # kept alive until the interpreter exits

__all__ = ["DOCS", "ROOT", "SiteBuild", "built_site", "public_names", "stub_page"]


@dataclass(frozen=True)
class SiteBuild:
    """The outcome of one build: its HTML folder, exit status, warnings and duration."""

    html: Path
    returncode: int
    warnings: str
    seconds: float


def sphinx_command(out: Path, doctrees: Path) -> list[str]:
    """``make docs``'s sphinx-build call, into ``out``."""
    return [sys.executable, "-m", "sphinx", "-E", "-W", "--keep-going", "-n", "-q", "-b", "html"] + [
        "-d",
        str(doctrees),
        str(DOCS),
        str(out),
    ]


@functools.cache
def built_site() -> SiteBuild:
    """Build the site once for this process and return where and how it went."""
    folder = tempfile.TemporaryDirectory(prefix="mixle_nb_docs_")
    _folders.append(folder)
    out, doctrees = Path(folder.name) / "html", Path(folder.name) / "doctrees"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    start = time.perf_counter()
    done = subprocess.run(
        sphinx_command(out, doctrees),
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=BUILD_TIMEOUT_S,
    )
    return SiteBuild(out, done.returncode, done.stderr, time.perf_counter() - start)
