"""Whether a test that cannot run must fail instead of skipping.

Under ``CI=true`` and under ``make test`` (which sets ``MIXLE_STRICT=1`` after installing
everything the suite needs) a missing browser, mixle, sshd or privilege is a failure; a bare
``pytest`` on a laptop skips with the reason.
"""

import os

import pytest

_TRUE = ("true", "1", "yes")


def strict() -> bool:
    """True under CI or ``make test``."""
    return any(os.environ.get(name, "").strip().lower() in _TRUE for name in ("CI", "MIXLE_STRICT"))


def unavailable(reason: str):
    """Fail under :func:`strict`, else skip; ``reason`` says what is missing and how to get it."""
    if strict():
        pytest.fail(f"{reason} (CI / make test: this test must run, not skip)", pytrace=False)
    pytest.skip(reason)


def import_or_unavailable(module: str):
    """``pytest.importorskip`` that fails under :func:`strict`."""
    try:
        return __import__(module, fromlist=["_"])
    except ImportError as exc:
        unavailable(f"needs {module} ({exc}); install the extras, e.g. pip install 'mixle_nb[mixle]'")
