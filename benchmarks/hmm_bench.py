"""One Baum–Welch iteration: mixle_nb's HMM against hmmlearn (both implementations) and, when
installed, pomegranate's ``DenseHMM`` (CPU), side by side in one run, from the same start, one
thread each.

Problems: 1-D Gaussian emissions with 8 states, and categorical emissions with 32 symbols and 8
states; full size 1,000 sequences x 1,000 steps, ``--quick`` 300 x 500. Each number is the least
of ``--repeats`` runs of CPU time of this process (``time.process_time``: this machine is shared
and its wall clock counts other people's work) and, beside it, the least wall time; the runs are
interleaved, every contender once a round, so that a slow spell falls on all of them alike.

What is timed, per library:

- mixle_nb ``em_step``: one E-step (forward–backward over the encoded sequences) and M-step of
  the HMM family, on data encoded once beforehand (as a handle keeps it resident); on the CPU
  the forward–backward runs compiled (``mixle_nb/stats/hmm/compiled.py``, numba), compiled or
  loaded from numba's disk cache by the warm-up call, which is not timed;
- mixle_nb ``fit``: ``GaussianHMM`` / ``CategoricalHMM(n_iter=1).fit(X, lengths)`` as a user
  calls it, with the checks and the encoding;
- hmmlearn: ``fit(X, lengths)`` with ``n_iter=1`` and ``init_params=""`` (its per-sequence
  C++ forward–backward; its checks cost little);
- pomegranate: ``DenseHMM(max_iter=1).fit`` on a (sequences, steps, 1) tensor (float32, its default).

The fitted parameters are compared with hmmlearn's (largest absolute difference) as a check that
the same iteration was timed. The tables also go to ``benchmarks/results/hmm_bench.json``
(``--json PATH``, the schema of ``benchmarks/results.py``), which the docs' benchmark page shows. Run: ``OMP_NUM_THREADS=1 python benchmarks/hmm_bench.py [--quick]``.
"""

from __future__ import annotations

import argparse
import time
import warnings
from functools import partial

import numpy as np
import torch
from results import Table, add_json_argument, write_results

from mixle_nb.hmm import CategoricalHMM, GaussianHMM
from mixle_nb.stats.estimation import em_step

STATES = 8
SYMBOLS = 32


def markov_states(rng, sequences: int, steps: int, startprob, transmat) -> np.ndarray:
    """(sequences, steps) state paths, one vectorised draw per time step."""
    cdf = np.cumsum(transmat, axis=1)
    states = np.empty((sequences, steps), dtype=np.int64)
    states[:, 0] = rng.choice(len(startprob), size=sequences, p=startprob)
    for t in range(1, steps):
        u = rng.random(sequences)
        states[:, t] = np.minimum((u[:, None] > cdf[states[:, t - 1]]).sum(axis=1), len(startprob) - 1)
    return states


def problem(kind: str, sequences: int, steps: int, seed: int = 0):
    """Data drawn from a true HMM, and a start that differs from it."""
    rng = np.random.default_rng(seed)
    transmat = 0.8 * np.eye(STATES) + 0.2 * rng.dirichlet(np.ones(STATES), STATES)
    startprob = np.full(STATES, 1.0 / STATES)
    states = markov_states(rng, sequences, steps, startprob, transmat).reshape(-1)
    start = {
        "startprob_": np.full(STATES, 1.0 / STATES),
        "transmat_": 0.6 * np.eye(STATES) + 0.4 * rng.dirichlet(np.ones(STATES), STATES),
    }
    if kind == "gaussian":
        means = np.linspace(-8.0, 8.0, STATES)
        X = (means[states] + rng.normal(size=states.size))[:, None]
        start["means_"] = (means + rng.normal(scale=0.5, size=STATES))[:, None]
        start["covars_"] = np.full((STATES, 1), 1.5)
    else:
        emission = rng.dirichlet(np.full(SYMBOLS, 0.3), STATES)
        cdf = np.cumsum(emission, axis=1)
        X = np.minimum((rng.random(states.size)[:, None] > cdf[states]).sum(axis=1), SYMBOLS - 1)[:, None]
        start["emissionprob_"] = rng.dirichlet(np.ones(SYMBOLS), STATES)
    return X, np.full(sequences, steps), start


def model(cls, kind: str, implementation: str, start: dict, **kw):
    extra = {"n_features": SYMBOLS} if kind == "categorical" else {}
    m = cls(STATES, init_params="", n_iter=1, tol=-np.inf, implementation=implementation, **extra, **kw)
    for name, value in start.items():
        setattr(m, name, value.copy())
    return m


def fit_from(cls, kind: str, implementation: str, start: dict, X: np.ndarray, lengths):
    """One Baum–Welch iteration of ``cls`` from ``start``, as a user calls it."""
    return model(cls, kind, implementation, start).fit(X, lengths)


def interleaved(contenders: dict, repeats: int) -> tuple[dict, dict]:
    """Each contender called once a round for ``repeats`` rounds, in turn, so that a slow spell of
    this shared machine falls on all of them alike: each one's least CPU time and least wall time
    (ms), and its last result."""
    cpu: dict = {name: [] for name in contenders}
    wall: dict = {name: [] for name in contenders}
    results: dict = {}
    for _ in range(repeats):
        for name, fn in contenders.items():
            c, w = time.process_time(), time.perf_counter()
            results[name] = fn()
            cpu[name].append(time.process_time() - c)
            wall[name].append(time.perf_counter() - w)
    return {name: (1e3 * min(cpu[name]), 1e3 * min(wall[name])) for name in contenders}, results


def parameters(m, kind: str) -> np.ndarray:
    emission = [m.means_.ravel(), m._covars_.ravel()] if kind == "gaussian" else [m.emissionprob_.ravel()]
    return np.concatenate([m.startprob_, m.transmat_.ravel(), *emission])


def one_thread() -> None:
    """One thread for torch (and numba, which pomegranate imports)."""
    torch.set_num_threads(1)
    try:
        import numba

        numba.set_num_threads(1)
    except ImportError:
        pass


def pomegranate_iteration(kind: str, X: np.ndarray, sequences: int, steps: int, start: dict):
    """A callable running one pomegranate DenseHMM iteration from ``start``; None if not installed."""
    try:
        from pomegranate.distributions import Categorical, Normal
        from pomegranate.hmm import DenseHMM
    except ImportError:
        return None
    one_thread()  # importing pomegranate (through numba) sets torch to 2 threads
    if kind == "gaussian":
        data = torch.from_numpy(X.reshape(sequences, steps, 1).astype(np.float32))
    else:
        data = torch.from_numpy(X.reshape(sequences, steps, 1).astype(np.int64))

    def run():
        if kind == "gaussian":
            dists = [
                Normal(np.float32([m]), np.float32([v]), covariance_type="diag")
                for m, v in zip(start["means_"][:, 0], start["covars_"][:, 0])
            ]
        else:
            dists = [Categorical(p[None, :].astype(np.float32)) for p in start["emissionprob_"]]
        edges, starts = start["transmat_"].astype(np.float32), start["startprob_"].astype(np.float32)
        hmm = DenseHMM(dists, edges=edges, starts=starts, max_iter=1, tol=0.0)
        one_thread()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            hmm.fit(data)
        return hmm

    return run


def compare(kind: str, sequences: int, steps: int, repeats: int) -> tuple[Table, dict[str, float]]:
    """One iteration of each contender on one problem: the times, and the parameters' differences."""
    X, lengths, start = problem(kind, sequences, steps)
    cls = GaussianHMM if kind == "gaussian" else CategoricalHMM
    from hmmlearn import hmm as hmmlearn_hmm

    theirs_cls = getattr(hmmlearn_hmm, cls.__name__)
    contenders: dict = {}
    for implementation in ("scaling", "log"):
        face = model(cls, kind, implementation, start)
        estimator, hmm_model = face.family_estimator(), face._model()
        enc = face._encode(X, lengths)
        em_step(enc, estimator, hmm_model)  # warm up (and compile, on first use)
        contenders[("mixle_nb em_step", implementation)] = partial(em_step, enc, estimator, hmm_model)
        contenders[("mixle_nb fit", implementation)] = partial(fit_from, cls, kind, implementation, start, X, lengths)
        contenders[("hmmlearn fit", implementation)] = partial(
            fit_from, theirs_cls, kind, implementation, start, X, lengths
        )
    run = pomegranate_iteration(kind, X, sequences, steps, start)
    assert torch.get_num_threads() == 1
    if run is not None:
        run()
        contenders[("pomegranate DenseHMM (float32)", "-")] = run
    times, results = interleaved(contenders, repeats)
    differences = {
        implementation: float(
            np.max(
                np.abs(
                    parameters(results[("mixle_nb fit", implementation)], kind)
                    - parameters(results[("hmmlearn fit", implementation)], kind)
                )
            )
        )
        for implementation in ("scaling", "log")
    }
    best_hmmlearn = min(times[("hmmlearn fit", i)][0] for i in ("scaling", "log"))
    title = f"{kind}: {sequences} sequences x {steps} steps, {STATES} states" + (
        f", {SYMBOLS} symbols" if kind == "categorical" else ""
    )
    table = Table(title, ["contender", "implementation", "CPU ms", "wall ms", "CPU / hmmlearn's best"])
    print(title, flush=True)
    for (name, implementation), (cpu, wall) in times.items():
        table.add(name, implementation, cpu, wall, cpu / best_hmmlearn)
        print(f"  {name:34s} {implementation:8s} {cpu:9.1f} CPU ms {wall:9.1f} wall ms {cpu / best_hmmlearn:6.2f}x")
    if run is None:
        print("pomegranate: not installed (pip install 'mixle_nb[bench]')")
    return table, differences


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="300 sequences x 500 steps (else 1,000 x 1,000)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--only", choices=["gaussian", "categorical"])
    add_json_argument(parser, "hmm_bench")
    args = parser.parse_args()
    one_thread()
    sequences, steps = (300, 500) if args.quick else (1000, 1000)
    began = time.perf_counter()
    tables = []
    check = Table("Fitted parameters: largest absolute difference from hmmlearn's", ["problem", "scaling", "log"])
    for kind in ("gaussian", "categorical"):
        if args.only in (None, kind):
            table, differences = compare(kind, sequences, steps, args.repeats)
            tables.append(table)
            check.add(kind, differences["scaling"], differences["log"])
    print("fitted parameters, largest difference from hmmlearn's:", check.rows)
    print(f"(whole run: {time.perf_counter() - began:.0f} s wall, torch {torch.__version__}, one thread)")
    write_results(args.json, "hmm_bench", 1, [*tables, check])


if __name__ == "__main__":
    main()
