"""scikit-learn's own ``GaussianMixture`` tests, run with our class in its place.

scikit-learn ships its tests in the installed package. ``sklearn/mixture/tests/test_gaussian_mixture.py``
is copied to a temporary package with ``from sklearn.mixture import GaussianMixture`` pointing
at :class:`mixle_nb.mixture.GaussianMixture`, and run in a subprocess with scikit-learn's own
conftest as a plugin (its ``global_dtype`` and ``global_random_seed`` fixtures), as scikit-learn's
CI runs it: float64 (``SKLEARN_RUN_FLOAT32_TESTS`` unset) and ``SKLEARN_TESTS_GLOBAL_RANDOM_SEED``
at its default; then, with ``SKLEARN_RUN_FLOAT32_TESTS=1``, its float32 cases alone (17 tests:
float32 input gives float32 attributes and results, fitted by our float32 E-step).

Excluded, because they call scikit-learn's private API on the estimator:

- ``test_gaussian_mixture_n_parameters`` and ``test_gaussian_mixture_aic_bic``: call the
  private ``GaussianMixture._n_parameters()`` (ours counts free parameters with
  :mod:`mixle_nb.stats.parameters`; ``bic``/``aic`` equal scikit-learn's in
  ``tests/test_sklearn_mixture.py``);
- ``test_gaussian_mixture_precisions_init``: calls the private ``GaussianMixture._initialize(X, resp)``;
- ``test_gaussian_mixture_all_init_does_not_estimate_gaussian_parameters``: counts calls of
  scikit-learn's private ``_estimate_gaussian_parameters`` through a mock of its module
  (our M-step is the EM core's, which never calls it);
- the array-API tests (``-k "not array_api"``): they run only with ``SCIPY_ARRAY_API=1`` and
  array-api-strict installed, and our EM takes numpy arrays (and handles), as
  ``check_estimator``'s ``check_array_api_input`` status records.

The tests of scikit-learn's private module functions (``test_suffstat_sk_*``,
``test_compute_log_det_cholesky``, ...) run unchanged: they test scikit-learn's code, not our class.

About ``test_monotonic_likelihood``: it calls ``fit`` with ``warm_start=True, max_iter=1`` up to
600 times and requires the score never to fall. Past the fixed point the change is below one ulp
of the score, and both scikit-learn's class and ours then move by ±4e-16 (measured: 35 falls of
scikit-learn's own in 600 fits of its ``full`` case); the test holds because the loop stops
at ``converged_``, which a warm start must therefore report (scikit-learn carries the last
fit's lower bound into the next call's first gain, and so do we).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from strictness import import_or_unavailable

sklearn = import_or_unavailable("sklearn")

EXCLUDED = [
    "test_gaussian_mixture_n_parameters",
    "test_gaussian_mixture_aic_bic",
    "test_gaussian_mixture_precisions_init",
    "test_gaussian_mixture_all_init_does_not_estimate_gaussian_parameters",
]
SCIKIT_IMPORT = "from sklearn.mixture import GaussianMixture"
REPO = Path(__file__).resolve().parents[1]


def _run_suite(tmp_path: Path, keyword: str, float32: bool) -> str:
    """scikit-learn's mixture suite with our class, the tests ``keyword`` selects; its summary line."""
    source = Path(sklearn.__file__).parent / "mixture" / "tests" / "test_gaussian_mixture.py"
    suite = tmp_path / "sklearn_suite"
    suite.mkdir()
    (suite / "__init__.py").write_text("")
    text = source.read_text()
    assert re.search(rf"^{SCIKIT_IMPORT}$", text, flags=re.M), "scikit-learn's test module changed its import"
    (suite / "test_gaussian_mixture.py").write_text(
        re.sub(rf"^{SCIKIT_IMPORT}$", "from mixle_nb.mixture import GaussianMixture", text, flags=re.M)
    )
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
    }
    for name in ("SKLEARN_RUN_FLOAT32_TESTS", "SKLEARN_TESTS_GLOBAL_RANDOM_SEED", "SCIPY_ARRAY_API"):
        env.pop(name, None)
    if float32:
        env["SKLEARN_RUN_FLOAT32_TESTS"] = "1"
    env.pop("COVERAGE_PROCESS_CONFIG", None)  # the in-process tests cover the same code
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "sklearn.conftest"]
        + ["sklearn_suite", "-k", keyword],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    summary = run.stdout.strip().splitlines()[-1] if run.stdout.strip() else run.stderr
    assert run.returncode == 0, run.stdout[-5000:] + run.stderr[-2000:]
    assert "failed" not in summary and "error" not in summary, summary
    return summary


# ``-k`` matches substrings: ``not (name and not name_)`` leaves the tests whose names extend an
# excluded one (``test_gaussian_mixture_precisions_init_diag`` runs)
DESELECTED = " and ".join([*(f"not ({name} and not {name}_)" for name in EXCLUDED), "not array_api"])


@pytest.mark.subprocess
def test_scikit_learns_gaussian_mixture_suite_passes_with_our_class(tmp_path):
    summary = _run_suite(tmp_path, DESELECTED, float32=False)
    assert int(re.search(r"(\d+) passed", summary).group(1)) >= 45, summary


@pytest.mark.subprocess
def test_scikit_learns_float32_cases_pass_with_our_class(tmp_path):
    summary = _run_suite(tmp_path, f"float32 and {DESELECTED}", float32=True)
    assert int(re.search(r"(\d+) passed", summary).group(1)) >= 17, summary
