"""scikit-learn's own tests of ``BayesianGaussianMixture`` and the shared mixture tests, run with
our classes in place.

scikit-learn 1.9.1 ships ``sklearn/mixture/tests/test_bayesian_mixture.py`` and
``test_mixture.py`` in the installed package. Both are copied to a temporary directory with
``from sklearn.mixture import ...`` of the classes pointing at :mod:`mixle_nb.mixture`, and
run in a subprocess (its own imports, nothing of this process's state).

Excluded, and why: ``test_compare_covar_type`` calls the private ``_check_parameters`` and
``_initialize_parameters`` of scikit-learn's class, which ours does not have (its public fit
runs the same steps). ``test_log_dirichlet_norm`` and ``test_log_wishart_norm`` test
scikit-learn's own private helpers; they run unchanged (and pass) but test nothing of ours.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import sklearn

REPO = Path(__file__).resolve().parents[1]
OURS = {
    "test_bayesian_mixture.py": (
        "from sklearn.mixture import BayesianGaussianMixture",
        "from mixle_nb.mixture import BayesianGaussianMixture",
    ),
    "test_mixture.py": (
        "from sklearn.mixture import BayesianGaussianMixture, GaussianMixture",
        "from mixle_nb.mixture import BayesianGaussianMixture, GaussianMixture",
    ),
}
EXCLUDED = ["test_bayesian_mixture.py::test_compare_covar_type"]


@pytest.mark.subprocess
def test_scikit_learns_mixture_suite_passes_with_our_classes(tmp_path):
    source = Path(sklearn.__file__).parent / "mixture" / "tests"
    suite = tmp_path / "sklearn_mixture_suite"
    suite.mkdir()
    for name, (theirs, ours) in OURS.items():
        text = (source / name).read_text()
        assert re.search(rf"^{re.escape(theirs)}$", text, flags=re.M), f"{name} no longer imports {theirs!r}"
        (suite / name).write_text(re.sub(rf"^{re.escape(theirs)}$", ours, text, flags=re.M))
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
    }
    env.pop("COVERAGE_PROCESS_CONFIG", None)  # tests/test_bayesian_mixture.py covers the same code
    deselect = [arg for test in EXCLUDED for arg in ("--deselect", f"sklearn_mixture_suite/{test}")]
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "sklearn_mixture_suite", *deselect],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    summary = run.stdout.strip().splitlines()[-1] if run.stdout.strip() else run.stderr
    assert run.returncode == 0, run.stdout[-5000:] + run.stderr[-2000:]
    passed = int(re.search(r"(\d+) passed", summary).group(1))
    assert passed >= 20 and "failed" not in summary, summary
