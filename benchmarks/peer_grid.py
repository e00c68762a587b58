"""The EM core against its peers over a grid of sizes: per-iteration and whole-fit wall time.

Contenders: ``mixle_nb.mixture.GaussianMixture``, scikit-learn's ``GaussianMixture``,
pomegranate 1.1.2's ``GeneralMixtureModel`` of ``Normal`` (CPU, float64; it has no ``tied``
covariance) and torchgmm 0.1.4's ``GaussianMixture`` (float32, a Lightning trainer). All are
the ``bench`` extra, never the package's dependencies.

Per EM iteration: two fits from the same start (given means, identity-scaled covariances,
equal weights; no k-means), ``tol`` 0 so both run every iteration, ``max_iter`` ``LOW`` and
``LOW + steps``; the difference of their times over ``steps`` cancels set-up (validation,
encoding, a trainer's start). ``steps`` (per library and cell, in the JSON) is chosen by a
pilot so that the difference lasts about ``TIMED_S``: a few milliseconds' difference drowns
in a shared machine's noise. Whole fit: each library's own ``fit`` with its defaults
(k-means start, ``n_init=1``) but for ``n_components`` and ``covariance_type``. Best of
``--repeats`` rounds, the contenders interleaved within a round, each call after a short
settle (another library's thread pool may still spin). Threads: ``torch.set_num_threads``
and ``threadpoolctl`` for the BLAS, in this one process.

Run in slices (defaults: the whole grid)::

    .venv/bin/python benchmarks/peer_grid.py --n 1e2,1e3 --d 1,2 --k 2,8 --cov full,diag --threads 1,2

Cells already in the JSON are replaced, the others kept, so slices add up to the grid.
``--baseline TREE`` adds another source tree's ``mixle_nb`` (a ``git worktree`` of an earlier
commit, say) as the contender ``mixle_nb before``, timed in the same rounds, interleaved with
the others, by a child process that imports it (it measures its own calls, so the pipe costs
nothing); a cell then also holds ``before_ratio``, ours over it, per iteration and per fit.
``--clock cpu`` times the process's CPU time instead of wall time: on a shared machine the
time other processes hold the cores drops out (one thread only, where it is the work done).
``--plot-only`` redraws the heat map from the JSON alone; ``--grid-search`` times
``GridSearchCV(GaussianMixture(), {"n_components": range(1, 9)}, cv=5)`` on N = 1,000, D = 2,
ours against scikit-learn's, into the JSON's ``grid_search``.

JSON (``benchmarks/results/peer_grid.json``)::

    {"schema": 1,
     "runs": [{"date": ISO UTC, "machine": str, "cpus": int, "load": [1, 5, 15 min],
               "git": commit, "versions": {library: version}, "clock": "wall" | "cpu",
               "baseline": {"tree": path, "git": commit} (with --baseline)}, ...],
     "cells": [{"n": int, "d": int, "k": int, "covariance_type": str, "threads": int,
                "run": index into runs,
                "results": {library: {"iteration_s": float, "steps": int, "fit_s": float, "fit_n_iter": int}
                                      | {"trimmed": reason} | {"failed": error}},
                "iteration_ratio": ours / fastest peer's (null without a peer),
                "fit_ratio": the same for the whole fit,
                "fastest_peer": {"iteration": library, "fit": library},
                "before_ratio": {"iteration": ours / mixle_nb before, "fit": ...} (with --baseline)}, ...],
     "grid_search": {"run": index, "threads": 1, "seconds": {"mixle_nb": s, "scikit-learn": s}}}

Libraries are ``mixle_nb``, ``scikit-learn``, ``pomegranate``, ``torchgmm``. A library's
cell is ``trimmed`` (with the reason) where it does not apply (pomegranate's ``tied``), where
the data would not fit the memory budget (``--max-gb``, for every library), or where a
the largest smaller ``N`` of the same column predicts a round (a fit and ``2·LOW + steps``
iterations) longer than ``--max-fit-s`` here, scaled linearly to this ``N``: that library would
take minutes a cell.

The heat map (``benchmarks/results/peer_grid.png``): our time over the fastest peer's per
cell, per iteration and per fit, rows (covariance type, D, K), columns (N, threads); below
1 (blue) we are ahead.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import platform
import subprocess
import sys
import time
import warnings
from collections.abc import Callable
from datetime import datetime, timezone
from importlib.metadata import version
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch
from threadpoolctl import threadpool_limits

RESULTS = Path(__file__).parent / "results"
LIBRARIES = ("mixle_nb", "scikit-learn", "pomegranate", "torchgmm")
PEERS = LIBRARIES[1:]
BEFORE = "mixle_nb before"  # --baseline's contender: another source tree's mixle_nb
COVARIANCE_TYPES = ("full", "tied", "diag", "spherical")
LOW, PILOT_STEPS, MAX_STEPS = 2, 5, 200
TIMED_S = 0.1  # iterations enough that their difference takes about this long
# What a call's time is: wall time, or (``--clock cpu``) the process's CPU time, which on a shared
# machine leaves out the time other processes hold the cores (exact for one thread only)
CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}
clock = CLOCKS["wall"]


def make_data(n: int, d: int, k: int, seed: int = 0) -> np.ndarray:
    """``n`` points of ``d`` dimensions from ``k`` separated unit-ish Gaussians."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(0.0, 4.0, size=(k, d))
    labels = rng.integers(0, k, size=n)
    return centres[labels] + rng.normal(0.0, 1.0, size=(n, d)) * rng.uniform(0.5, 1.5, size=(k, d))[labels]


def start(x: np.ndarray, k: int, seed: int = 1) -> tuple[np.ndarray, np.ndarray, float]:
    """The shared start: ``k`` data points as means, equal weights, the data's variance."""
    rng = np.random.default_rng(seed)
    means = x[rng.choice(len(x), size=k, replace=False)]
    return np.full(k, 1.0 / k), means, float(x.var(axis=0).mean())


def precisions_init(cov: str, k: int, d: int, variance: float) -> np.ndarray:
    """scikit-learn's ``precisions_init`` for covariance ``variance·I``."""
    shapes = {"full": (k, d, d), "tied": (d, d), "diag": (k, d), "spherical": (k,)}
    if cov in ("full", "tied"):
        return np.broadcast_to(np.eye(d) / variance, shapes[cov]).copy()
    return np.full(shapes[cov], 1.0 / variance)


def mixle_fitter(x: np.ndarray, k: int, cov: str) -> tuple[Callable[[int], Any], Callable[[], int]]:
    from mixle_nb.mixture import GaussianMixture

    weights, means, variance = start(x, k)
    given = dict(weights_init=weights, means_init=means, precisions_init=precisions_init(cov, k, x.shape[1], variance))

    def steps(m: int) -> None:
        GaussianMixture(k, covariance_type=cov, tol=0, max_iter=m, **given).fit(x)

    def whole() -> int:
        return GaussianMixture(k, covariance_type=cov, random_state=0).fit(x).n_iter_

    return steps, whole


def sklearn_fitter(x: np.ndarray, k: int, cov: str) -> tuple[Callable[[int], Any], Callable[[], int]]:
    from sklearn.mixture import GaussianMixture

    weights, means, variance = start(x, k)
    given = dict(weights_init=weights, means_init=means, precisions_init=precisions_init(cov, k, x.shape[1], variance))

    def steps(m: int) -> None:
        GaussianMixture(k, covariance_type=cov, tol=0, max_iter=m, **given).fit(x)

    def whole() -> int:
        return GaussianMixture(k, covariance_type=cov, random_state=0).fit(x).n_iter_

    return steps, whole


POMEGRANATE_COV = {"full": "full", "diag": "diag", "spherical": "sphere"}


def pomegranate_fitter(x: np.ndarray, k: int, cov: str) -> tuple[Callable[[int], Any], Callable[[], int]]:
    from pomegranate.distributions import Normal
    from pomegranate.gmm import GeneralMixtureModel

    weights, means, variance = start(x, k)
    d = x.shape[1]
    kind = POMEGRANATE_COV[cov]
    xt = torch.from_numpy(np.ascontiguousarray(x))

    def covs() -> torch.Tensor:
        if kind == "full":
            return torch.eye(d, dtype=torch.float64) * variance
        return torch.full((d,), variance, dtype=torch.float64)  # "sphere" too: its means' shape

    def steps(m: int) -> None:
        components = [Normal(torch.from_numpy(mu.copy()), covs(), covariance_type=kind) for mu in means]
        GeneralMixtureModel(components, priors=torch.from_numpy(weights), max_iter=m, tol=-math.inf).fit(xt)

    def whole() -> int:
        components = [Normal(covariance_type=kind) for _ in range(k)]
        GeneralMixtureModel(components, random_state=0).fit(xt)
        return -1  # pomegranate does not report its iterations

    return steps, whole


def torchgmm_fitter(x: np.ndarray, k: int, cov: str) -> tuple[Callable[[int], Any], Callable[[], int]]:
    import logging

    from torchgmm.bayes import GaussianMixture

    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    logging.getLogger("pytorch_lightning").setLevel(logging.ERROR)
    _, means, _ = start(x, k)
    xt = torch.from_numpy(x.astype(np.float32))
    quiet = dict(enable_progress_bar=False, enable_model_summary=False, logger=False, accelerator="cpu")

    def steps(m: int) -> None:
        GaussianMixture(
            k,
            covariance_type=cov,
            init_means=torch.from_numpy(means.astype(np.float32)),
            convergence_tolerance=0.0,
            trainer_params=dict(max_epochs=m, **quiet),
        ).fit(xt)

    def whole() -> int:
        gm = GaussianMixture(k, covariance_type=cov, trainer_params=dict(**quiet))
        gm.fit(xt)
        return int(gm.num_iter_)

    return steps, whole


FITTERS = {
    "mixle_nb": mixle_fitter,
    "scikit-learn": sklearn_fitter,
    "pomegranate": pomegranate_fitter,
    "torchgmm": torchgmm_fitter,
}


class Timed(NamedTuple):
    """A call's own measured seconds and its value (the baseline's child times its calls)."""

    seconds: float
    value: Any


def timed(fn: Callable[[], Any], settle_s: float) -> tuple[float, Any]:
    time.sleep(settle_s)
    t0 = clock()
    out = fn()
    seconds = clock() - t0
    return (out.seconds, out.value) if isinstance(out, Timed) else (seconds, out)


class Baseline:
    """``mixle_nb`` from another source tree, in a child process that imports it first and
    answers one JSON line per call (``serve_baseline``), with the seconds it measured."""

    def __init__(self, tree: Path, clock_name: str):
        self.tree = tree.resolve()
        self.commit = git_commit(self.tree)
        env = {**os.environ, "PYTHONPATH": str(self.tree)}
        self.child = subprocess.Popen(
            [sys.executable, __file__, "--serve-baseline", "--clock", clock_name],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )

    def call(self, **request: Any) -> Timed:
        assert self.child.stdin is not None and self.child.stdout is not None
        self.child.stdin.write(json.dumps(request) + "\n")
        self.child.stdin.flush()
        reply = json.loads(self.child.stdout.readline() or '{"error": "the baseline child exited"}')
        if "error" in reply:
            raise RuntimeError(reply["error"])
        return Timed(reply["seconds"], reply["value"])

    def fitter(self, threads: int) -> Callable[[np.ndarray, int, str], tuple[Callable[[int], Any], Callable[[], Any]]]:
        """A ``FITTERS`` entry whose calls run in the child, on the same data (``make_data``)."""

        def make(x: np.ndarray, k: int, cov: str) -> tuple[Callable[[int], Any], Callable[[], Any]]:
            cell = dict(n=len(x), d=x.shape[1], k=k, cov=cov, threads=threads)
            return (lambda m: self.call(**cell, what="steps", m=m)), (lambda: self.call(**cell, what="fit"))

        return make

    def close(self) -> None:
        assert self.child.stdin is not None
        self.child.stdin.close()
        self.child.wait(timeout=60)


def serve_baseline() -> None:
    """The baseline's child: each request line is a cell and a call of ``mixle_fitter``'s."""
    fitters: dict[tuple, tuple[Callable[[int], Any], Callable[[], Any]]] = {}
    for line in sys.stdin:
        request = json.loads(line)
        try:
            torch.set_num_threads(request["threads"])
            threadpool_limits(limits=request["threads"])  # set for the process, as the parent's are
            key = (request["n"], request["d"], request["k"], request["cov"])
            if key not in fitters:
                fitters = {key: mixle_fitter(make_data(request["n"], request["d"], request["k"]), *key[2:])}
            steps, whole = fitters[key]
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                t0 = clock()
                if request["what"] == "grid_search":
                    from mixle_nb.mixture import GaussianMixture

                    value = one_grid_search(GaussianMixture, make_data(request["n"], request["d"], request["k"]))
                else:
                    value = steps(request["m"]) if request["what"] == "steps" else whole()
                reply = {"seconds": clock() - t0, "value": value}
        except Exception as error:
            reply = {"error": f"{type(error).__name__}: {error}"[:300]}
        print(json.dumps(reply), flush=True)


def measure_cell(
    x: np.ndarray, k: int, cov: str, libraries: dict[str, Callable[..., Any]], repeats: int, settle_s: float
) -> dict[str, dict[str, Any]]:
    """Best-of-``repeats`` per-iteration and whole-fit times of each library, interleaved; a
    library whose fit raises (pomegranate's unregularised covariances on few points) is
    ``{"failed": message}``."""
    failed: dict[str, dict[str, Any]] = {}
    fitters = {}
    for lib, make in libraries.items():
        try:
            fitters[lib] = make(x, k, cov)
            fitters[lib][0](1)  # warm-up: imports, first-call caches
        except Exception as error:
            failed[lib] = {"failed": f"{type(error).__name__}: {error}"[:300]}
    steps_of = {}
    for lib in fitters:
        if lib not in failed:
            try:
                steps_of[lib] = _steps(fitters[lib][0], settle_s)
            except Exception as error:
                failed[lib] = {"failed": f"{type(error).__name__}: {error}"[:300]}
    low: dict[str, list[float]] = {lib: [] for lib in fitters}
    high: dict[str, list[float]] = {lib: [] for lib in fitters}
    whole: dict[str, list[float]] = {lib: [] for lib in fitters}
    iterations: dict[str, int] = {}
    for _ in range(repeats):
        for lib, (steps, fit) in fitters.items():
            if lib in failed:
                continue
            try:
                low[lib].append(timed(lambda: steps(LOW), settle_s)[0])
                high[lib].append(timed(lambda: steps(LOW + steps_of[lib]), settle_s)[0])
                seconds, iterations[lib] = timed(fit, settle_s)
                whole[lib].append(seconds)
            except Exception as error:
                failed[lib] = {"failed": f"{type(error).__name__}: {error}"[:300]}
    measured = {
        lib: {
            "iteration_s": (min(high[lib]) - min(low[lib])) / steps_of[lib],
            "steps": steps_of[lib],
            "fit_s": min(whole[lib]),
            "fit_n_iter": iterations[lib],
        }
        for lib in fitters
        if lib not in failed
    }
    return {**measured, **failed}


def _steps(steps: Callable[[int], Any], settle_s: float) -> int:
    """Iterations to difference: enough for about ``TIMED_S`` by a pilot of ``PILOT_STEPS``
    (a short difference drowns in the set-up's noise), at most ``MAX_STEPS``."""
    pilot = timed(lambda: steps(LOW + PILOT_STEPS), settle_s)[0] - timed(lambda: steps(LOW), settle_s)[0]
    per_iteration = max(pilot / PILOT_STEPS, TIMED_S / MAX_STEPS)
    return int(min(MAX_STEPS, max(PILOT_STEPS, math.ceil(TIMED_S / per_iteration))))


def ratios(results: dict[str, dict[str, Any]]) -> tuple[dict[str, float | None], dict[str, str | None]]:
    """Ours over the fastest peer's, per iteration and per fit, and which peer that is."""
    ratio: dict[str, float | None] = {}
    fastest: dict[str, str | None] = {}
    for what, key in (("iteration", "iteration_s"), ("fit", "fit_s")):
        # a difference at or below 0: that peer's iterations are below the noise of its set-up
        peers = {lib: r[key] for lib, r in results.items() if lib in PEERS and r.get(key, 0.0) > 0.0}
        ours = results.get("mixle_nb", {}).get(key)
        if not peers or ours is None or ours <= 0.0:
            ratio[what], fastest[what] = None, None
            continue
        best = min(peers, key=lambda lib: peers[lib])
        fastest[what] = best
        ratio[what] = ours / peers[best]
    return ratio, fastest


def cell_key(cell: dict[str, Any]) -> tuple:
    return (cell["n"], cell["d"], cell["k"], cell["covariance_type"], cell["threads"])


def git_commit(tree: Path) -> str:
    try:
        return subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=tree, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def machine() -> dict[str, Any]:
    commit = git_commit(Path(__file__).parent)
    versions = {}
    for lib, dist in (("scikit-learn", "scikit-learn"), ("pomegranate", "pomegranate"), ("torchgmm", "torchgmm")):
        try:
            versions[lib] = version(dist)
        except Exception:
            versions[lib] = "not installed"
    versions["torch"] = torch.__version__
    return {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": f"{platform.node()} {platform.machine()} {platform.processor() or ''}".strip(),
        "cpus": os.cpu_count(),
        "load": list(os.getloadavg()),
        "git": commit,
        "versions": versions,
    }


def load(path: Path) -> dict[str, Any]:
    if path.exists():
        return json.loads(path.read_text())
    return {"schema": 1, "runs": [], "cells": []}


def trimmed_reason(
    lib: str, n: int, d: int, k: int, cov: str, threads: int, done: list[dict[str, Any]], args: argparse.Namespace
) -> str | None:
    """Why ``lib`` skips this cell, or ``None``."""
    if lib == "pomegranate" and cov == "tied":
        return "pomegranate has no tied covariance"
    gigabytes = n * d * 8 * (1 + k) / 1e9  # the data and one (K, N, D)-sized temporary
    if gigabytes > args.max_gb:
        return f"about {gigabytes:.0f} GB of data and temporaries over the --max-gb {args.max_gb:g} budget"
    previous = [
        c for c in done if c["n"] < n and (c["d"], c["k"], c["covariance_type"], c["threads"]) == (d, k, cov, threads)
    ]
    if previous:
        cell = max(previous, key=lambda c: c["n"])
        result = cell["results"].get(lib, {})
        if "fit_s" in result:
            # a round here: its fit and its timed iterations, scaled linearly from the last N
            timed_iterations = 2 * LOW + result.get("steps", PILOT_STEPS)
            predicted = (result["fit_s"] + timed_iterations * max(result["iteration_s"], 0.0)) * n / cell["n"]
            if predicted > args.max_fit_s:
                return f"a round at N={cell['n']} took {result['fit_s']:.3g} s: about {predicted:.0f} s here"
    return None


def with_ratios(cell: dict[str, Any]) -> dict[str, Any]:
    """``cell`` with its ratios and fastest peers (re)computed from its results, and ours over
    ``mixle_nb before``'s where the cell has both."""
    ratio, fastest = ratios(cell["results"])
    out = {**cell, "iteration_ratio": ratio["iteration"], "fit_ratio": ratio["fit"], "fastest_peer": fastest}
    ours, before = cell["results"].get("mixle_nb", {}), cell["results"].get(BEFORE, {})
    if "fit_s" in ours and "fit_s" in before:
        out["before_ratio"] = {
            what: ours[key] / before[key] if before[key] > 0 else None
            for what, key in (("iteration", "iteration_s"), ("fit", "fit_s"))
        }
    return out


def plot(data: dict[str, Any], path: Path) -> None:
    """The heat map: ours / fastest peer per cell, per iteration and per fit."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.colors import LogNorm

    cells = data["cells"]
    if not cells:
        return
    rows = sorted(
        {(c["covariance_type"], c["d"], c["k"]) for c in cells},
        key=lambda r: (COVARIANCE_TYPES.index(r[0]), r[1], r[2]),
    )
    cols = sorted({(c["n"], c["threads"]) for c in cells})
    fig, axes = plt.subplots(1, 2, figsize=(4 + 1.1 * len(cols) * 2, 1.5 + 0.32 * len(rows)), squeeze=False)
    norm = LogNorm(vmin=1 / 8, vmax=8)
    for ax, what in zip(axes[0], ("iteration", "fit")):
        grid = np.full((len(rows), len(cols)), np.nan)
        for c in cells:
            value = c.get(f"{what}_ratio")
            if value:
                grid[rows.index((c["covariance_type"], c["d"], c["k"])), cols.index((c["n"], c["threads"]))] = value
        image = ax.imshow(grid, cmap="coolwarm", norm=norm, aspect="auto")
        for i in range(len(rows)):
            for j in range(len(cols)):
                if np.isfinite(grid[i, j]):
                    ax.text(j, i, f"{grid[i, j]:.2f}", ha="center", va="center", fontsize=7)
        ax.set_xticks(range(len(cols)), [f"N={n:.0e}\n{t} thr" for n, t in cols], fontsize=7)
        ax.set_yticks(range(len(rows)), [f"{cov} D={d} K={k}" for cov, d, k in rows], fontsize=7)
        ax.set_title(f"mixle_nb / fastest peer, per {what} (< 1: ahead)", fontsize=9)
        fig.colorbar(image, ax=ax, shrink=0.8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def grid_search(repeats: int, settle_s: float, baseline: Baseline | None = None) -> dict[str, float]:
    """Best-of-``repeats`` seconds of ``GridSearchCV(GaussianMixture(), {"n_components":
    range(1, 9)}, cv=5)`` on N = 1,000, D = 2, ours and scikit-learn's (and the baseline's),
    interleaved."""
    from sklearn.mixture import GaussianMixture as Theirs

    from mixle_nb.mixture import GaussianMixture as Ours

    x = make_data(1000, 2, 3)
    searches: dict[str, Callable[[], Any]] = {
        "mixle_nb": lambda: one_grid_search(Ours, x),
        "scikit-learn": lambda: one_grid_search(Theirs, x),
    }
    if baseline is not None:
        searches[BEFORE] = lambda: baseline.call(n=1000, d=2, k=3, cov="full", threads=1, what="grid_search")
    times: dict[str, list[float]] = {lib: [] for lib in searches}
    for _ in range(repeats):
        for lib, search in searches.items():
            times[lib].append(timed(search, settle_s)[0])
    return {lib: min(t) for lib, t in times.items()}


def one_grid_search(estimator: type, x: np.ndarray) -> None:
    """``GridSearchCV(estimator(random_state=0), {"n_components": range(1, 9)}, cv=5).fit(x)``."""
    from sklearn.model_selection import GridSearchCV

    GridSearchCV(estimator(random_state=0), {"n_components": range(1, 9)}, cv=5).fit(x)


def numbers(text: str, kind: Callable[[str], Any] = int) -> list:
    return [kind(float(v)) if kind is int else kind(v) for v in text.split(",") if v]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", default="1e2,1e3,1e4,1e5,1e6,1e7")
    parser.add_argument("--d", default="1,2,8,32,64")
    parser.add_argument("--k", default="2,8,32")
    parser.add_argument("--cov", default=",".join(COVARIANCE_TYPES))
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--libraries", default=",".join(LIBRARIES))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--settle", type=float, default=0.1, help="seconds before each timed call")
    parser.add_argument("--max-gb", type=float, default=4.0, help="skip cells whose data and temporaries exceed this")
    parser.add_argument("--max-fit-s", type=float, default=60.0, help="skip a library predicted to take longer a fit")
    parser.add_argument("--json", type=Path, default=RESULTS / "peer_grid.json")
    parser.add_argument("--png", type=Path, default=RESULTS / "peer_grid.png")
    parser.add_argument("--plot-only", action="store_true", help="redraw the heat map from the JSON")
    parser.add_argument(
        "--grid-search", action="store_true", help="time GridSearchCV over n_components 1-8 (N=1,000, D=2) instead"
    )
    parser.add_argument("--baseline", type=Path, help="a source tree whose mixle_nb runs beside as 'mixle_nb before'")
    parser.add_argument("--serve-baseline", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument(
        "--clock", choices=tuple(CLOCKS), default="wall", help="wall time, or the process's CPU time (1 thread only)"
    )
    args = parser.parse_args()
    global clock
    clock = CLOCKS[args.clock]
    if args.clock == "cpu" and args.threads != "1" and not args.serve_baseline:
        parser.error("--clock cpu measures one thread's work: use it with --threads 1")
    if args.serve_baseline:
        serve_baseline()
        return
    data = load(args.json)
    baseline = Baseline(args.baseline, args.clock) if args.baseline else None
    if args.grid_search or not args.plot_only:
        data["runs"].append({**machine(), "clock": args.clock})
    if baseline is not None:
        data["runs"][-1]["baseline"] = {"tree": str(baseline.tree), "git": baseline.commit}
    if args.grid_search:
        with threadpool_limits(limits=1):
            torch.set_num_threads(1)
            seconds = grid_search(args.repeats, args.settle, baseline)
        data["grid_search"] = {"run": len(data["runs"]) - 1, "threads": 1, "seconds": seconds}
        print(f"GridSearchCV, 1 thread: {seconds}", flush=True)
    elif not args.plot_only:
        libraries = [lib for lib in args.libraries.split(",") if lib] + ([BEFORE] if baseline else [])
        run = len(data["runs"]) - 1
        by_key = {cell_key(c): c for c in data["cells"]}
        for threads in numbers(args.threads):
            torch.set_num_threads(threads)
            with threadpool_limits(limits=threads):
                for cov in args.cov.split(","):
                    for d in numbers(args.d):
                        for k in numbers(args.k):
                            done: list[dict[str, Any]] = []
                            for n in sorted(numbers(args.n)):
                                if n < 2 * k:
                                    continue
                                x = make_data(n, d, k) if n * d * 8 / 1e9 <= args.max_gb else None
                                results: dict[str, dict[str, Any]] = {}
                                running = []
                                for lib in libraries:
                                    reason = trimmed_reason(lib, n, d, k, cov, threads, done, args)
                                    if reason is None and x is None:
                                        reason = "data over the --max-gb budget"
                                    if reason:
                                        results[lib] = {"trimmed": reason}
                                    else:
                                        running.append(lib)
                                if running and x is not None:
                                    with warnings.catch_warnings():
                                        warnings.simplefilter("ignore")
                                        factories = {
                                            lib: baseline.fitter(threads)
                                            if baseline and lib == BEFORE
                                            else FITTERS[lib]
                                            for lib in running
                                        }
                                        results.update(measure_cell(x, k, cov, factories, args.repeats, args.settle))
                                ratio, fastest = ratios(results)
                                cell = with_ratios(
                                    {
                                        "n": n,
                                        "d": d,
                                        "k": k,
                                        "covariance_type": cov,
                                        "threads": threads,
                                        "run": run,
                                        "results": results,
                                        "iteration_ratio": ratio["iteration"],
                                        "fit_ratio": ratio["fit"],
                                        "fastest_peer": fastest,
                                    }
                                )
                                done.append(cell)
                                by_key[cell_key(cell)] = cell
                                shown = {
                                    lib: (
                                        (r.get("trimmed") or r.get("failed") or "")[:20]
                                        if "iteration_s" not in r
                                        else f"{1e3 * r['iteration_s']:.3g}/{1e3 * r['fit_s']:.4g} ms"
                                    )
                                    for lib, r in results.items()
                                }
                                print(f"{cov} N={n} D={d} K={k} thr={threads}: {shown} ratio {ratio}", flush=True)
                                del x
                                gc.collect()
                                data["cells"] = sorted(by_key.values(), key=cell_key)
                                args.json.parent.mkdir(parents=True, exist_ok=True)
                                args.json.write_text(json.dumps(data, indent=1))
    if baseline is not None:
        baseline.close()
    data["cells"] = [with_ratios(cell) for cell in data["cells"]]
    args.json.write_text(json.dumps(data, indent=1))
    plot(data, args.png)


if __name__ == "__main__":
    main()
