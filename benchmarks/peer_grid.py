"""The EM core against its peers over a grid of sizes: per-iteration and whole-fit wall time.

Contenders (``benchmarks/grid_contenders.py``): ``mixle_nb.mixture.GaussianMixture``,
scikit-learn's ``GaussianMixture``, pomegranate 1.1.2's ``GeneralMixtureModel`` of ``Normal``
(CPU, float64; no ``tied``) and torchgmm 0.1.4's ``GaussianMixture`` (float32, a Lightning
trainer), over N ∈ {1e2 … 1e7}, D ∈ {1, 2, 8, 32, 64}, K ∈ {2, 8, 32}, the four covariance types,
at 1 and 2 threads (``torch.set_num_threads`` and ``threadpoolctl`` for the BLAS, in this one
process). The whole grid at both thread counts, and the grid search::

    .venv/bin/python benchmarks/peer_grid.py --grid-search

Per EM iteration: two fits from the same start (given means, covariances ``σ²·I``, equal
weights; no k-means), ``tol`` 0 so both run every iteration, ``LOW`` and ``LOW + steps``
iterations; their difference over ``steps`` cancels set-up (validation, encoding, a trainer's
start). ``steps`` (per library and cell, in the JSON) is chosen by a pilot of ``LOW`` and
``LOW + PILOT_STEPS`` so that the difference lasts about ``TIMED_S`` or the set-up's own time,
whichever is longer (a difference shorter than the set-up drowns in its noise). Whole fit: each
library's own ``fit`` with its defaults but ``n_components``, ``covariance_type`` and the seed
(``random_state``; torchgmm: torch's global seed); a round's sample is the mean over the seeds
``fit_seeds(N)`` gives, the same for every library (0 to 19 up to N = 1e3, 0 to 4 up to 1e4,
else 0): one seed compares the luck of one start.

Repeats are adaptive: rounds of every contender's calls, interleaved (a slow spell of a shared
machine falls on all alike), until each has spent ``--cell-s`` in the cell (at least one
round, at most ``--repeats``): many rounds for small cells, one for large. Each time is the
least over its rounds (noise on a shared machine only adds). Every call but the baseline's is
stopped at ``--max-call-s`` (a ``SIGALRM``), and the rules of ``benchmarks/grid_trims.py``
skip, with the reason in the JSON, what would pass it, what does not fit ``--max-gb``, and, once
``--budget-min`` is spent, the cells not reached (the order is N ascending, so those are the
largest).

Slices (``--n 1e2,1e3 --d 1,2 --k 2,8 --cov full,diag --threads 1 --libraries ...``) write to
``--out`` (default ``benchmarks/results/peer_grid.json``), replacing the cells they measure and
keeping the others, so slices add up to the grid; ``--resume`` skips the cells the file already
holds from this commit (an interrupted run goes on); ``--merge A.json B.json`` merges slice
files into ``--out``. ``--baseline TREE`` adds another source tree's ``mixle_nb`` (a ``git
worktree`` of an earlier commit) as the contender ``mixle_nb before``, timed in the same rounds
by a child process that imports it and measures its own calls; a cell then also holds
``before_ratio``. ``--clock cpu`` times the process's CPU time instead of wall time (one thread
only). ``--grid-search`` also times ``GridSearchCV(GaussianMixture(), {"n_components": range(1,
9)}, cv=5)`` on N = 1,000, D = 2, ours against scikit-learn's, at each thread count, first (its
time is the budget's too), each search stopped at ``GRID_SEARCH_CAP`` times ``--max-call-s``.
``--plot-only`` redraws the heat maps from the JSON.

JSON (schema 2)::

    {"schema": 2,
     "runs": [{"date": ISO UTC, "end": ISO UTC, "elapsed_s": float, "command": str,
               "machine": str, "cpus": int, "load": [1, 5, 15 min] at the start, "load_end": [...],
               "git": commit, "versions": {library: version}, "clock": "wall" | "cpu",
               "environment": {"OPENBLAS_THREAD_TIMEOUT": value} (SPIN_ENV, set for the run),
               "options": {"max_call_s", "max_gb", "cell_s", "repeats", "budget_min"},
               "baseline": {"tree": path, "git": commit} (with --baseline)}, ...],
     "cells": [{"n", "d", "k", "covariance_type", "threads", "run": index into runs,
                "load": 1-min load average when measured, "elapsed_s": the cell's seconds,
                "results": {library: {"iteration_s", "steps", "low_s", "rounds",
                                      "fit_s", "fit_n_iter" (the mean over the seeds; -1: not
                                      reported), "fit_seeds" (how many), "fit_rounds", "spent_s",
                                      "iteration_trimmed" | "fit_trimmed": {"kind", "reason"},
                                      "iteration_failed" | "fit_failed": message}},
                "iteration_ratio": ours / the fastest peer's (null without both),
                "fit_ratio": the same for the whole fit,
                "fastest_peer": {"iteration": library, "fit": library},
                "before_ratio": {"iteration", "fit"} (with --baseline)}, ...],
     "grid_search": [{"run", "threads", "seconds": {library: s, or null: stopped at the cap}}, ...]}

The heat maps (``benchmarks/results/peer_grid_{1,2}thread.png``, ``benchmarks/peer_grid_report.py``):
per thread count, our time over the fastest peer's per cell, per iteration and per fit.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import platform
import signal
import subprocess
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from importlib.metadata import version
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch
from grid_contenders import FITTERS, Steps, Whole, load_modules, make_data, mixle_fitter
from grid_trims import MEASURES, OUTPACE, PILOT_STEPS, Trims, affine, trim
from peer_grid_report import plot_all, summary
from threadpoolctl import threadpool_limits

RESULTS = Path(__file__).parent / "results"
# OpenBLAS's idle workers wait about 2**4 cycles, not its default 2**28 (about 0.1 s), before they
# sleep: read when OpenBLAS loads (with_short_blas_spin)
SPIN_ENV = {"OPENBLAS_THREAD_TIMEOUT": "4"}
LIBRARIES = tuple(FITTERS)
OURS = "mixle_nb"
PEERS = LIBRARIES[1:]
BEFORE = "mixle_nb before"  # --baseline's contender: another source tree's mixle_nb
COVARIANCE_TYPES = ("full", "tied", "diag", "spherical")
SCHEMA = 2
LOW, MAX_STEPS = 2, 200
TIMED_S = 0.1  # the difference of the two fits lasts at least about this long
FIT_SEEDS = ((1_000, 20), (10_000, 5))  # (up to this N, a whole fit's seeds a round): fit_seeds
GRID_SEARCH_ROUNDS, GRID_SEARCH_ROUND_S = 3, 10.0
GRID_SEARCH_CAP = 20  # a search (40 fits) is stopped at this many --max-call-s  # --grid-search: rounds, fewer after a round this long
# What a call's time is: wall time, or (``--clock cpu``) the process's CPU time, which on a shared
# machine leaves out the time other processes hold the cores (exact for one thread only)
CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}
clock = CLOCKS["wall"]


class OverCap(Exception):
    """A call ran past ``--max-call-s`` and was stopped."""


def over_cap(error: BaseException) -> bool:
    """Whether ``error`` is, or was raised from, an ``OverCap`` (a library may wrap it)."""
    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, OverCap):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def _alarm(signum: int, frame: Any) -> None:
    raise OverCap


@contextmanager
def capped(seconds: float | None) -> Iterator[None]:
    """Raise ``OverCap`` in the block once it has run ``seconds`` (``None``: no cap)."""
    if seconds is None:
        yield
        return
    previous = signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


class Timed(NamedTuple):
    """A call's own measured seconds and its value (the baseline's child times its calls)."""

    seconds: float
    value: Any


def timed(fn: Callable[[], Any], settle_s: float, cap_s: float | None) -> tuple[float, Any]:
    """Seconds of one call of ``fn`` after a short settle, and its value; ``OverCap`` past ``cap_s``."""
    time.sleep(settle_s)
    with capped(cap_s):
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
        """One call in the child: its measured seconds and value."""
        assert self.child.stdin is not None and self.child.stdout is not None
        self.child.stdin.write(json.dumps(request) + "\n")
        self.child.stdin.flush()
        reply = json.loads(self.child.stdout.readline() or '{"error": "the baseline child exited"}')
        if "error" in reply:
            raise RuntimeError(reply["error"])
        return Timed(reply["seconds"], reply["value"])

    def fitter(self, threads: int) -> Callable[[np.ndarray, int, str], tuple[Steps, Whole]]:
        """A ``FITTERS`` entry whose calls run in the child, on the same data (``make_data``)."""

        def make(x: np.ndarray, k: int, cov: str) -> tuple[Steps, Whole]:
            cell = dict(n=len(x), d=x.shape[1], k=k, cov=cov, threads=threads)
            return (lambda m: self.call(**cell, what="steps", m=m)), (
                lambda seed: self.call(**cell, what="fit", seed=seed)
            )

        return make

    def close(self) -> None:
        """End the child (its stdin closed) and wait for it."""
        assert self.child.stdin is not None
        self.child.stdin.close()
        self.child.wait(timeout=60)


def serve_baseline() -> None:
    """The baseline's child: each request line is a cell and a call of ``mixle_fitter``'s."""
    fitters: dict[tuple, tuple[Steps, Whole]] = {}
    load_modules(["mixle_nb"])
    for line in sys.stdin:
        request = json.loads(line)
        try:
            torch.set_num_threads(request["threads"])
            threadpool_limits(limits=request["threads"])  # set for the process, as the parent's are
            key = (request["n"], request["d"], request["k"], request["cov"])
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                t0 = clock()
                if request["what"] == "grid_search":
                    from mixle_nb.mixture import GaussianMixture

                    value = one_grid_search(GaussianMixture, make_data(request["n"], request["d"], request["k"]))
                else:
                    if key not in fitters:
                        fitters = {key: mixle_fitter(make_data(*key[:3]), *key[2:])}
                    steps, whole = fitters[key]
                    t0 = clock()
                    value = steps(request["m"]) if request["what"] == "steps" else whole(request["seed"])
                reply = {"seconds": clock() - t0, "value": value}
        except Exception as error:
            reply = {"error": f"{type(error).__name__}: {error}"[:300]}
        print(json.dumps(reply), flush=True)


@dataclass
class Contender:
    """One library in one cell: its calls, what it measures there, and its samples so far."""

    steps: Steps
    whole: Whole
    measures: set[str]
    cap_s: float | None
    entry: dict[str, Any] = field(default_factory=dict)  # trims and failures
    low: list[float] = field(default_factory=list)
    high: list[float] = field(default_factory=list)
    fits: list[float] = field(default_factory=list)
    n_steps: int | None = None  # None: a pilot chooses it
    fit_seeds: tuple[int, ...] = (0,)  # a round's whole-fit sample: the mean over these seeds
    n_iter: Any = None
    spent_s: float = 0.0

    def call(self, measure: str, fn: Callable[[], Any], settle_s: float, at: str = "") -> tuple[float, Any] | None:
        """Time ``fn`` for ``measure``; a call over the cap or raising drops the measure (``None``),
        its message prefixed by ``at`` (which seed) where given."""
        try:
            seconds, value = timed(fn, settle_s, self.cap_s)
        except Exception as error:
            if over_cap(error):
                self.drop(
                    measure, f"{measure}_trimmed", trim("cap", f"a call passed the {self.cap_s:g} s cap: stopped")
                )
                self.spent_s += self.cap_s or 0.0
            else:
                self.drop(measure, f"{measure}_failed", f"{at}{type(error).__name__}: {error}"[:300])
            return None
        self.spent_s += seconds
        return seconds, value

    def drop(self, measure: str, key: str, why: Any) -> None:
        """Stop measuring ``measure`` here, saying why."""
        self.measures.discard(measure)
        self.entry[key] = why

    def pilot(self, settle_s: float) -> None:
        """``LOW`` and ``LOW + PILOT_STEPS`` iterations, and from them the ``steps`` to difference."""
        low = self.call("iteration", lambda: self.steps(LOW), settle_s)
        high = self.call("iteration", lambda: self.steps(LOW + PILOT_STEPS), settle_s) if low else None
        if low is None or high is None:
            return
        self.n_steps = steps_for(low[0], (high[0] - low[0]) / PILOT_STEPS, high[0] / (LOW + PILOT_STEPS))
        self.low.append(low[0])
        if self.n_steps == PILOT_STEPS:
            self.high.append(high[0])

    def round(self, index: int, settle_s: float) -> None:
        """Round ``index``: a sample of each measure still on (the pilot's stand for the first round's)."""
        assert self.n_steps is not None or "iteration" not in self.measures
        if "iteration" in self.measures and len(self.low) <= index:
            sample = self.call("iteration", lambda: self.steps(LOW), settle_s)
            self.low += [sample[0]] if sample else []
        if "iteration" in self.measures and len(self.high) <= index:
            sample = self.call("iteration", lambda: self.steps(LOW + self.n_steps), settle_s)
            self.high += [sample[0]] if sample else []
        if "fit" in self.measures:
            samples = []
            for seed in self.fit_seeds:  # each its own capped call
                sample = self.call("fit", lambda seed=seed: self.whole(seed), settle_s, f"random_state={seed}: ")
                if sample is None:
                    return
                samples.append(sample)
            self.fits.append(sum(seconds for seconds, _ in samples) / len(samples))
            iterations = [n for _, n in samples]
            self.n_iter = -1 if min(iterations) < 0 else sum(iterations) / len(iterations)  # -1: not reported

    def result(self) -> dict[str, Any]:
        """The JSON entry: the least of each time over the rounds, and the trims and failures."""
        out = dict(self.entry)
        if "iteration" in self.measures and self.low and self.high and self.n_steps:
            out.update(
                iteration_s=(min(self.high) - min(self.low)) / self.n_steps,
                steps=self.n_steps,
                low_s=min(self.low),
                rounds=len(self.high),
            )
        if "fit" in self.measures and self.fits:
            out.update(
                fit_s=min(self.fits), fit_n_iter=self.n_iter, fit_seeds=len(self.fit_seeds), fit_rounds=len(self.fits)
            )
        out["spent_s"] = round(self.spent_s, 3)
        return out


def fit_seeds(n: int) -> tuple[int, ...]:
    """The seeds (``random_state``) a whole fit is timed at in a cell of ``n`` points, by
    ``FIT_SEEDS``: 0 to 19 up to N = 1e3, 0 to 4 up to 1e4, else 0 alone. A fit's time is mostly
    its iterations, and how many its start leaves turns on the seed: at N = 100, D = 2, K = 8
    (diagonal) ours ran 21 at seed 0 and scikit-learn's 6; over seeds 0-4 11.4 and 5.6, over
    0-99 10.8 and 9.4, over 0-149 10.1 and 9.8 (5 iterations' spread from seed to seed). Above
    N = 1e4 a fit lasts tenths of a second to seconds, and these separated clusters mostly leave 2
    or 3 iterations."""
    for most_n, count in FIT_SEEDS:
        if n <= most_n:
            return tuple(range(count))
    return (0,)


def steps_for(low_s: float, per_iteration_s: float, most_s: float) -> int:
    """Iterations to difference: enough to last ``TIMED_S`` or the ``LOW`` fit's own time (its
    set-up's noise), whichever is longer; ``PILOT_STEPS`` to ``MAX_STEPS``. ``most_s`` bounds an
    iteration from above (a call's time over its iterations): a pilot's difference drowned in
    noise counts as an eighth of it, not as nothing, so that no call runs hundreds of slow steps."""
    per_iteration = max(per_iteration_s, most_s / 8, 1e-7)
    return int(min(MAX_STEPS, max(PILOT_STEPS, math.ceil(max(TIMED_S, low_s) / per_iteration))))


def measure_cell(
    contenders: dict[str, Contender], settle_s: float, cell_s: float, repeats: int, floors: dict[str, dict[str, float]]
) -> None:
    """The first round library by library, the cheapest (by ``floors``) first, each after a pilot
    where no smaller N predicts its steps; a peer whose floor (its least time in any cell so far)
    is over ``OUTPACE`` times a peer's time here is dropped (``outpaced``) before it runs. Then
    interleaved rounds until each has spent ``cell_s`` (``repeats`` rounds at most)."""
    order = sorted(contenders, key=lambda lib: sum(floors.get(lib, {}).values()))
    for lib in order:
        contender = contenders[lib]
        if lib in PEERS:
            for measure in list(contender.measures):
                why = outpaced(lib, measure, floors, contenders)
                if why:
                    contender.drop(measure, f"{measure}_trimmed", why)
        if "iteration" in contender.measures and contender.n_steps is None:
            contender.pilot(settle_s)
        if contender.measures:
            contender.round(0, settle_s)
    for index in range(1, repeats):
        going = [c for c in contenders.values() if c.measures and c.spent_s < cell_s]
        if not going:
            return
        for contender in going:
            contender.round(index, settle_s)


def outpaced(
    lib: str, measure: str, floors: dict[str, dict[str, float]], contenders: dict[str, Contender]
) -> dict[str, str] | None:
    """Drop peer ``lib``'s ``measure`` where its floor is over ``OUTPACE`` times another peer's time here."""
    floor = floors.get(lib, {}).get(measure)
    if floor is None:
        return None
    for other, contender in contenders.items():
        seconds = contender.result().get(f"{measure}_s", 0.0) if other in PEERS and other != lib else 0.0
        if seconds > 0.0 and floor > OUTPACE * seconds:
            return trim(
                "outpaced",
                f"its least {measure} in any cell so far, {floor:.3g} s, is over {OUTPACE:g}x {other}'s {seconds:.3g} s here",
            )
    return None


def ratios(results: dict[str, dict[str, Any]]) -> tuple[dict[str, float | None], dict[str, str | None]]:
    """Ours over the fastest peer's, per iteration and per fit, and which peer that is."""
    ratio: dict[str, float | None] = {}
    fastest: dict[str, str | None] = {}
    for measure in MEASURES:
        key = f"{measure}_s"
        # a difference at or below 0: that library's iterations are below the noise of its set-up
        peers = {lib: r[key] for lib, r in results.items() if lib in PEERS and r.get(key, 0.0) > 0.0}
        ours = results.get(OURS, {}).get(key)
        if not peers or ours is None or ours <= 0.0:
            ratio[measure], fastest[measure] = None, None
            continue
        best = min(peers, key=lambda lib: peers[lib])
        fastest[measure] = best
        ratio[measure] = ours / peers[best]
    return ratio, fastest


def with_ratios(cell: dict[str, Any]) -> dict[str, Any]:
    """``cell`` with its ratios and fastest peers (re)computed from its results, and ours over
    ``mixle_nb before``'s where the cell has both."""
    ratio, fastest = ratios(cell["results"])
    out = {**cell, "iteration_ratio": ratio["iteration"], "fit_ratio": ratio["fit"], "fastest_peer": fastest}
    ours, before = cell["results"].get(OURS, {}), cell["results"].get(BEFORE, {})
    shared = [m for m in MEASURES if f"{m}_s" in ours and before.get(f"{m}_s", 0.0) > 0.0]
    if shared:
        out["before_ratio"] = {m: ours[f"{m}_s"] / before[f"{m}_s"] for m in shared}
    return out


def cell_key(cell: dict[str, Any]) -> tuple:
    return (cell["n"], cell["d"], cell["k"], cell["covariance_type"], cell["threads"])


def git_commit(tree: Path) -> str:
    try:
        return subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=tree, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def machine() -> dict[str, Any]:
    """This run's provenance: date, command, machine, load, commit and the libraries' versions."""
    versions = {}
    for lib in ("scikit-learn", "pomegranate", "torchgmm"):
        try:
            versions[lib] = version(lib)
        except Exception:
            versions[lib] = "not installed"
    versions["torch"] = torch.__version__
    return {
        "date": now(),
        "command": " ".join(["python", "benchmarks/peer_grid.py", *sys.argv[1:]]),
        "machine": f"{platform.node()} {platform.machine()} {platform.processor() or ''}".strip(),
        "cpus": os.cpu_count(),
        "load": list(os.getloadavg()),
        "git": git_commit(Path(__file__).parent),
        "versions": versions,
        "environment": {name: os.environ.get(name) for name in SPIN_ENV},
    }


def load(path: Path) -> dict[str, Any]:
    """The grid JSON at ``path`` (an empty grid where there is none); an older schema is refused."""
    if not path.exists():
        return {"schema": SCHEMA, "runs": [], "cells": [], "grid_search": []}
    data = json.loads(path.read_text())
    if data.get("schema") != SCHEMA:
        raise SystemExit(
            f"{path} holds schema {data.get('schema')}, this script writes {SCHEMA}: "
            "write to another --out, or remove the file to start the grid again"
        )
    return data


def merge(into: dict[str, Any], other: dict[str, Any]) -> None:
    """Add ``other``'s runs, cells (replacing those of the same key) and grid searches to ``into``."""
    offset = len(into["runs"])
    into["runs"] += other["runs"]
    by_key = {cell_key(c): c for c in into["cells"]}
    for cell in other["cells"]:
        by_key[cell_key(cell)] = {**cell, "run": cell["run"] + offset}
    into["cells"] = sorted(by_key.values(), key=cell_key)
    searches = {s["threads"]: s for s in into["grid_search"]}
    searches.update({s["threads"]: {**s, "run": s["run"] + offset} for s in other["grid_search"]})
    into["grid_search"] = [searches[t] for t in sorted(searches)]


def save(data: dict[str, Any], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1) + "\n")


def grid_search(
    threads: int, settle_s: float, cap_s: float, baseline: Baseline | None = None
) -> dict[str, float | None]:
    """Seconds of ``GridSearchCV(GaussianMixture(), {"n_components": range(1, 9)}, cv=5)`` on
    N = 1,000, D = 2, ours and scikit-learn's (and the baseline's), interleaved: the least of
    ``GRID_SEARCH_ROUNDS`` rounds, fewer once a round has taken ``GRID_SEARCH_ROUND_S``; a search
    stopped at ``cap_s`` is ``None``."""
    from sklearn.mixture import GaussianMixture as Theirs

    from mixle_nb.mixture import GaussianMixture as Ours

    x = make_data(1000, 2, 3)
    searches: dict[str, Callable[[], Any]] = {
        OURS: lambda: one_grid_search(Ours, x),
        "scikit-learn": lambda: one_grid_search(Theirs, x),
    }
    if baseline is not None:
        searches[BEFORE] = lambda: baseline.call(n=1000, d=2, k=3, cov="full", threads=threads, what="grid_search")
    times: dict[str, list[float]] = {lib: [] for lib in searches}
    stopped: set[str] = set()
    for _ in range(GRID_SEARCH_ROUNDS):
        round_started = time.monotonic()
        for lib in [lib for lib in searches if lib not in stopped]:
            try:
                times[lib].append(timed(searches[lib], settle_s, None if lib == BEFORE else cap_s)[0])
            except Exception as error:
                if not over_cap(error):
                    raise
                stopped.add(lib)
        if time.monotonic() - round_started > GRID_SEARCH_ROUND_S:
            break
    return {lib: min(t) if t else None for lib, t in times.items()}


def one_grid_search(estimator: type, x: np.ndarray) -> None:
    """``GridSearchCV(estimator(random_state=0), {"n_components": range(1, 9)}, cv=5).fit(x)``."""
    from sklearn.model_selection import GridSearchCV

    GridSearchCV(estimator(random_state=0), {"n_components": range(1, 9)}, cv=5).fit(x)


def numbers(text: str) -> list[int]:
    return [int(float(v)) for v in text.split(",") if v]


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--n", default="1e2,1e3,1e4,1e5,1e6,1e7")
    parser.add_argument("--d", default="1,2,8,32,64")
    parser.add_argument("--k", default="2,8,32")
    parser.add_argument("--cov", default=",".join(COVARIANCE_TYPES))
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--libraries", default=",".join(LIBRARIES))
    parser.add_argument("--repeats", type=int, default=5, help="rounds a cell at most")
    parser.add_argument("--cell-s", type=float, default=0.3, help="rounds until each contender spent this in a cell")
    parser.add_argument("--settle", type=float, default=0.0, help="seconds before each timed call")
    parser.add_argument("--max-call-s", type=float, default=3.0, help="stop a call, and trim what would pass it")
    parser.add_argument("--max-gb", type=float, default=12.0, help="skip cells whose data and temporaries exceed this")
    parser.add_argument("--budget-min", type=float, default=18.5, help="trim the cells not reached by then")
    parser.add_argument("--out", "--json", dest="out", type=Path, default=RESULTS / "peer_grid.json")
    parser.add_argument("--resume", action="store_true", help="skip cells --out already holds from this commit")
    parser.add_argument("--merge", type=Path, nargs="+", help="merge these slice files into --out, and plot")
    parser.add_argument("--plot-only", action="store_true", help="redraw the heat maps from --out")
    parser.add_argument("--grid-search", action="store_true", help="also time GridSearchCV (N=1,000, D=2, K 1-8)")
    parser.add_argument("--baseline", type=Path, help="a source tree whose mixle_nb runs beside as 'mixle_nb before'")
    parser.add_argument("--serve-baseline", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument(
        "--clock", choices=tuple(CLOCKS), default="wall", help="wall time, or the process's CPU time (1 thread only)"
    )
    args = parser.parse_args(argv)
    if args.clock == "cpu" and args.threads != "1" and not args.serve_baseline:
        parser.error("--clock cpu measures one thread's work: use it with --threads 1")
    unknown = set(args.libraries.split(",")) - set(LIBRARIES)
    if unknown:
        parser.error(f"--libraries: unknown {sorted(unknown)}; the contenders are {', '.join(LIBRARIES)}")
    unknown = set(args.cov.split(",")) - set(COVARIANCE_TYPES)
    if unknown:
        parser.error(f"--cov: unknown {sorted(unknown)}; the covariance types are {', '.join(COVARIANCE_TYPES)}")
    return args


class Grid:
    """One run over the slice of the grid its options name, into ``data``."""

    def __init__(self, args: argparse.Namespace, data: dict[str, Any], baseline: Baseline | None, started: float):
        self.args = args
        self.data = data
        self.baseline = baseline
        self.run = len(data["runs"]) - 1
        self.trims = Trims(args.max_call_s, args.max_gb)
        self.by_key = {cell_key(c): c for c in data["cells"]}
        commit = data["runs"][-1]["git"]
        self.kept = {key for key, c in self.by_key.items() if args.resume and data["runs"][c["run"]]["git"] == commit}
        self.libraries = [lib for lib in args.libraries.split(",") if lib] + ([BEFORE] if baseline else [])
        self.deadline = started + 60 * args.budget_min  # the run's start: the grid search's time counts
        self.warmed: set[tuple[str, str, int]] = set()
        # threads -> library -> measure -> its least time in any cell so far (a floor: set-up costs)
        self.floors: dict[int, dict[str, dict[str, float]]] = {threads: {} for threads in numbers(args.threads)}

    def run_all(self) -> None:
        """Every cell of the slice, N ascending (then D, K), each (N, D, K)'s data made once."""
        covs = self.args.cov.split(",")
        for n in sorted(numbers(self.args.n)):
            for d in sorted(numbers(self.args.d)):
                for k in sorted(numbers(self.args.k)):
                    if n < 2 * k:
                        continue
                    x: np.ndarray | None = None
                    for cov in covs:
                        for threads in numbers(self.args.threads):
                            key = (n, d, k, cov, threads)
                            if key in self.kept:
                                self.note(self.by_key[key])
                                continue
                            plan = self.plan(n, d, k, cov, threads)
                            if x is None and any(measures for measures, _ in plan.values()):
                                x = make_data(n, d, k)
                            self.cell(x, n, d, k, cov, threads, plan)
                    del x
                    gc.collect()

    def plan(self, n: int, d: int, k: int, cov: str, threads: int) -> dict[str, tuple[set[str], dict[str, Any]]]:
        """Per library, the measures it takes here and its entry of trims for the others: the
        budget, the trim rules, then the peers outpaced by another measured one, then ours
        where no peer is left."""
        plan: dict[str, tuple[set[str], dict[str, Any]]] = {lib: (set(), {}) for lib in self.libraries}
        spent = time.monotonic() > self.deadline
        for lib, (measures, entry) in plan.items():
            for measure in MEASURES:
                if spent:
                    why = trim("budget", f"the run's --budget-min {self.args.budget_min:g} was spent before this cell")
                else:
                    why = self.trims.reason(OURS if lib == BEFORE else lib, measure, n, d, k, cov, threads)
                if why:
                    entry[f"{measure}_trimmed"] = why
                else:
                    measures.add(measure)
        for measure in MEASURES:
            for lib in [p for p in self.libraries if p in PEERS and measure in plan[p][0]]:
                others = [p for p in self.libraries if p in PEERS and p != lib and measure in plan[p][0]]
                why = self.trims.outpaced(lib, others, measure, n, d, k, cov, threads)
                if why:
                    plan[lib][0].discard(measure)
                    plan[lib][1][f"{measure}_trimmed"] = why
            if not any(measure in plan[p][0] for p in self.libraries if p in PEERS):
                for lib in (OURS, BEFORE):
                    if lib in plan and measure in plan[lib][0]:
                        plan[lib][0].discard(measure)
                        plan[lib][1][f"{measure}_trimmed"] = trim("no peer", "every peer's is trimmed here")
        return plan

    def cell(
        self,
        x: np.ndarray | None,
        n: int,
        d: int,
        k: int,
        cov: str,
        threads: int,
        plan: dict[str, tuple[set[str], dict[str, Any]]],
    ) -> None:
        """Measure one cell by its plan, record it and write the JSON."""
        started = time.monotonic()
        contenders: dict[str, Contender] = {}
        results: dict[str, dict[str, Any]] = {}
        torch.set_num_threads(threads)
        with threadpool_limits(limits=threads), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for lib in self.libraries:
                measures, entry = plan[lib]
                if not measures:
                    results[lib] = entry
                    continue
                assert x is not None
                cap = None if lib == BEFORE else self.args.max_call_s  # the child's call cannot be stopped
                try:
                    make = self.baseline.fitter(threads) if self.baseline and lib == BEFORE else FITTERS[lib]
                    steps, whole = make(x, k, cov)
                    if (lib, cov, threads) not in self.warmed:  # imports, caches, compilation: uncapped
                        steps(1)
                        self.warmed.add((lib, cov, threads))
                except Exception as error:
                    failed = f"{type(error).__name__}: {error}"[:300]
                    results[lib] = {**entry, **{f"{m}_failed": failed for m in measures}}
                    continue
                contenders[lib] = Contender(
                    steps,
                    whole,
                    set(measures),
                    cap,
                    dict(entry),
                    n_steps=self.steps(lib, n, d, k, cov, threads),
                    fit_seeds=fit_seeds(n),
                )
            measure_cell(contenders, self.args.settle, self.args.cell_s, self.args.repeats, self.floors[threads])
        results.update({lib: c.result() for lib, c in contenders.items()})
        elapsed = time.monotonic() - started
        cell = with_ratios(
            {
                "n": n,
                "d": d,
                "k": k,
                "covariance_type": cov,
                "threads": threads,
                "run": self.run,
                "load": os.getloadavg()[0],
                "elapsed_s": round(elapsed, 2),
                "results": {lib: results[lib] for lib in self.libraries},
            }
        )
        self.note(cell)
        self.by_key[cell_key(cell)] = cell
        self.data["cells"] = sorted(self.by_key.values(), key=cell_key)
        save(self.data, self.args.out)
        print(line(cell), flush=True)

    def steps(self, lib: str, n: int, d: int, k: int, cov: str, threads: int) -> int | None:
        """The steps to difference as the column's last two N predict them (``None``: a pilot's)."""
        column = (OURS if lib == BEFORE else lib, d, k, cov, threads)
        points = [(m, r) for m, r in self.trims.history.get(column, []) if r.get("iteration_s", 0.0) > 0.0]
        if len(points) < 2:
            return None
        low = affine([(m, r["low_s"]) for m, r in points], n)
        return steps_for(low, affine([(m, r["iteration_s"]) for m, r in points], n), low / LOW)

    def note(self, cell: dict[str, Any]) -> None:
        """Give a cell's results to the trim rule (ours and the baseline's as one) and the floors."""
        floors = self.floors.setdefault(cell["threads"], {})
        for lib, result in cell["results"].items():
            for measure in MEASURES:
                seconds = result.get(f"{measure}_s", 0.0)
                if seconds > 0.0:
                    least = floors.setdefault(lib, {}).get(measure, math.inf)
                    floors[lib][measure] = min(least, seconds)
            if lib != BEFORE:
                self.trims.record(
                    lib, cell["n"], cell["d"], cell["k"], cell["covariance_type"], cell["threads"], result
                )


def line(cell: dict[str, Any]) -> str:
    """A cell's progress line: each library's ms an iteration / ms a fit, or why not, and the ratios."""
    shown = []
    for lib, r in cell["results"].items():
        parts = []
        for measure in MEASURES:
            if f"{measure}_s" in r:
                parts.append(f"{1e3 * r[f'{measure}_s']:.3g}")
            else:
                parts.append(
                    r.get(f"{measure}_trimmed", {}).get("kind")
                    or ("failed" if r.get(f"{measure}_failed") or r.get("failed") else "-")
                )
        shown.append(f"{lib} {'/'.join(parts)}")
    ratio = "/".join("-" if cell[f"{m}_ratio"] is None else f"{cell[f'{m}_ratio']:.2f}" for m in MEASURES)
    head = f"{cell['covariance_type']} N={cell['n']:.0e} D={cell['d']} K={cell['k']} thr={cell['threads']}"
    return f"{head}: {'; '.join(shown)} ms; ours/fastest {ratio}"


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    global clock
    clock = CLOCKS[args.clock]
    if args.serve_baseline:
        serve_baseline()
        return
    data = load(args.out)
    if args.merge:
        for path in args.merge:
            merge(data, load(path))
    elif not args.plot_only:
        load_modules(args.libraries.split(","))
        started = time.monotonic()
        data["runs"].append({**machine(), "clock": args.clock})
        data["runs"][-1]["options"] = {
            "max_call_s": args.max_call_s,
            "max_gb": args.max_gb,
            "cell_s": args.cell_s,
            "repeats": args.repeats,
            "budget_min": args.budget_min,
        }
        baseline = Baseline(args.baseline, args.clock) if args.baseline else None
        if baseline is not None:
            data["runs"][-1]["baseline"] = {"tree": str(baseline.tree), "git": baseline.commit}
        try:
            if args.grid_search:  # first: its time comes out of the budget the grid gets
                searches = {s["threads"]: s for s in data["grid_search"]}
                for threads in numbers(args.threads):
                    torch.set_num_threads(threads)
                    with threadpool_limits(limits=threads), warnings.catch_warnings():
                        warnings.simplefilter("ignore")
                        seconds = grid_search(threads, args.settle, GRID_SEARCH_CAP * args.max_call_s, baseline)
                    searches[threads] = {"run": len(data["runs"]) - 1, "threads": threads, "seconds": seconds}
                    print(f"GridSearchCV, {threads} thread(s): {seconds}", flush=True)
                data["grid_search"] = [searches[t] for t in sorted(searches)]
            Grid(args, data, baseline, started).run_all()
        finally:
            if baseline is not None:
                baseline.close()
        data["runs"][-1].update(
            end=now(), elapsed_s=round(time.monotonic() - started, 1), load_end=list(os.getloadavg())
        )
    data["cells"] = [with_ratios(cell) for cell in data["cells"]]
    save(data, args.out)
    plot_all(data, args.out.with_suffix(""))
    print(summary(data), flush=True)


def with_short_blas_spin() -> None:
    """Re-run this script with ``SPIN_ENV`` set, unless it is set (read when OpenBLAS loads).

    An OpenBLAS thread pool's workers spin for about 0.1 s after each call before they sleep.
    numpy and scipy each load their own OpenBLAS, and scikit-learn calls both, so at two threads
    on two cores two spinning workers took the cores from the thread doing the work: scikit-learn's
    full-covariance iteration at N = 1,000, D = 32, K = 2 took 10.2 ms, 0.84 ms with the spin
    short (one thread: 0.36 ms), and ours after it 1.2 ms, 0.70 ms (measured on the 2-core EPYC of
    ``docs/benchmarks.md``). Every contender runs in this process and its children under it."""
    if any(name not in os.environ for name in SPIN_ENV):
        os.execve(sys.executable, [sys.executable, *sys.argv], {**SPIN_ENV, **os.environ})


if __name__ == "__main__":
    with_short_blas_spin()
    main()
