"""What the live panels cost, side by side in one run on a 2-engine cluster.

    .venv/bin/python benchmarks/panel_bench.py [--redraws 200] [--steps 200] [--rounds 7]

Redraw: the notebook's CPU (thread CPU time) and wall time per redraw of each panel, with the
figure kept and only the changed artists redrawn (what the panels do), against building a new
figure for every redraw (what they did), over a growing 200-step history. Target: 20 ms. Also
a redraw whose step axes widen (both x axes drawn again), one whose step axes widen to limits
they had before (their x axes kept), and one with one axes drawn again whole. ``--baseline
DIR`` also times another checkout's EMView and LossView (their axes' limits) and LiveFigure
against this one's, interleaved in this process.

Run N: ``panel.run(n)`` wall time per step (batched: calls of several steps, about
``batch_seconds`` each, the first call one step to measure, the next call queued behind the
running one) against the ranks' own step (n EM steps in one call on every rank, timed there;
the mean of one such call at the start of the round and one at its end), against one bare
``cluster.run`` per step (the client's round trip, nothing drawn) and against the panel
sending one step a call (``batch_seconds=0``), at N = 1e6 and N = 1e3 observations,
interleaved round by round so all see the same machine load; the batched ratio of every round
is printed too. Target at N = 1e6: the panel's step at most 1.1x the ranks'. ``--pin`` puts
both engines on core 0 and this process and the controller on core 1, as on a host where the
notebook has a core of its own.

``--local``: instead, the step of a local panel (no cluster: the panel's own in-process rank) at
the sizes a notebook steps at (N = 1,000, D = 2, K = 3, full covariance, one thread), this
thread's CPU ms a step (the panel's redraws run on a timer thread and are left out): a
scikit-learn iteration (fits of 2 and 2 + ``--steps`` iterations from the same start,
differenced), our EM step alone (``em_step`` on the panel's own encoding, each from the last
step's model: the arithmetic the panel runs), ``EMPanel.step`` and, with ``--baseline DIR``,
the EMPanel of the mixle_nb checked out in DIR, interleaved round by round (each going first in
turn), best of ``--rounds``. The panel's cost over the EM step is its per-step overhead, which a
machine's load blurs, so it is also measured alone ("outside EM": the panel's steps with
``em_step`` replaced by a copy of one step's record). Target: the panel's step no slower than
scikit-learn's iteration. Results: benchmarks/results/panel_bench.json.
"""

from __future__ import annotations

import argparse
import importlib
import os
import statistics
import sys
import time

import numpy as np
import psutil
from results import Table, add_json_argument, write_results

from mixle_nb.cluster import MixleCluster
from mixle_nb.cluster.rank_side import em_step_on_rank
from mixle_nb.stats import GaussianDistribution, MixtureDistribution, seq_encode
from mixle_nb.stats.estimation import em_step
from mixle_nb.widgets import EMPanel, em_view
from mixle_nb.widgets.em_view import EMView
from mixle_nb.widgets.loss_view import LossView


def problem(n: int):
    rng = np.random.default_rng(0)
    x = np.concatenate([rng.normal(-2, 1, n // 2), rng.normal(3, 0.7, n - n // 2)])
    start = MixtureDistribution(
        [GaussianDistribution(-1, 1), GaussianDistribution(0.5, 1), GaussianDistribution(2, 1)], [0.3, 0.3, 0.4]
    )
    return x, start


def timed(fn) -> tuple[float, float]:
    """(thread CPU seconds, wall seconds) of one call."""
    c, t = time.thread_time(), time.perf_counter()
    fn()
    return time.thread_time() - c, time.perf_counter() - t


def summary(samples) -> str:
    cpu, wall = (np.array(s) * 1e3 for s in zip(*samples))
    return f"{np.median(cpu):>8.1f} {cpu.mean():>8.1f} {np.median(wall):>9.1f} {wall.mean():>9.1f}"


def em_history(steps: int, n: int = 2000):
    """Data, start model, the models of ``steps`` EM steps from it (the start first) and their
    log-densities: what a panel draws."""
    x, model = problem(n)
    enc, est = seq_encode(x, model=model), model.estimator()
    models, densities = [model], []
    for _ in range(steps):
        step = em_step(enc, est, models[-1])
        models.append(step.model)
        densities.append(step.log_density)
    return x, model, models, densities


def loss_history(redraws: int):
    """``frame(view, i)``: render ``view`` with the first ``i`` of ``redraws`` loss reports of
    two ranks (falling from 5.2 towards 1.2 nats, with noise) and the held-out points so far."""
    rng = np.random.default_rng(1)
    losses = {
        r: [
            (5 * s, 5 * s * 1024, 4.0 * np.exp(-s / 40) + 1.2 + 0.1 * rng.standard_normal())
            for s in range(1, redraws + 1)
        ]
        for r in range(2)
    }
    held = [(5 * s, 5 * s * 1024, 4.0 * np.exp(-s / 40) + 1.3) for s in range(10, redraws + 1, 10)]

    def frame(view, i):
        return view.render({r: p[:i] for r, p in losses.items()}, [h for h in held if h[0] <= 5 * i])

    return frame


def redraw_bench(redraws: int) -> None:
    x, model, models, densities = em_history(redraws)
    seconds = [0.01, 0.012]
    kept = EMView(model, x, distributed=True)
    em_kept = [timed(lambda i=i: kept.render(densities[:i], models[i], seconds)) for i in range(1, redraws + 1)]
    em_new = [
        timed(lambda i=i: EMView(model, x, distributed=True).render(densities[:i], models[i], seconds))
        for i in range(1, redraws + 1, max(redraws // 20, 1))
    ]
    widen, widen_kept, whole = [], [], []
    for i in range(20):  # the step axes widened from 10 steps: to new limits, to limits they had
        kept.render(densities[:10], models[10], seconds)
        widen.append(timed(lambda i=i: kept.render(densities[:10], models[10], seconds, axis_steps=20 * 2**i)))
        kept.render(densities[:10], models[10], seconds)
        widen_kept.append(timed(lambda: kept.render(densities[:10], models[10], seconds, axis_steps=20)))
        kept.live.invalidate(kept.objective)  # one axes drawn again, whole
        whole.append(timed(lambda: kept.render(densities[:10], models[10], seconds, axis_steps=20)))
    loss_frame = loss_history(redraws)
    loss_kept_view = LossView(entropy_floor=1.1)
    loss_kept = [timed(lambda i=i: loss_frame(loss_kept_view, i)) for i in range(1, redraws + 1)]
    loss_new = [
        timed(lambda i=i: loss_frame(LossView(entropy_floor=1.1), i))
        for i in range(1, redraws + 1, max(redraws // 20, 1))
    ]
    print(f"\nRedraw over a growing {redraws}-step history, milliseconds (target <= 20)")
    print(f"{'panel':<10} {'figure':<22} {'CPU med':>8} {'CPU mean':>8} {'wall med':>9} {'wall mean':>9}")
    for name, how, samples in (
        ("EMPanel", "kept, blitted", em_kept),
        ("EMPanel", "new every redraw", em_new),
        ("EMPanel", "step axes widen", widen),
        ("EMPanel", "... to kept limits", widen_kept),
        ("EMPanel", "one axes redrawn", whole),
        ("TrainPanel", "kept, blitted", loss_kept),
        ("TrainPanel", "new every redraw", loss_new),
    ):
        print(f"{name:<10} {how:<22} {summary(samples)}")


def baseline_package(baseline: str) -> str:
    """The name the mixle_nb of checkout ``baseline`` is imported as (once)."""
    from em_bench import load_baseline  # this folder is on the path of a script run from it

    if "mixle_nb_baseline" not in sys.modules:
        load_baseline(baseline, "mixle_nb_baseline")
    return "mixle_nb_baseline"


def views_ab(baseline: str, redraws: int) -> None:
    """This checkout's EMView and LossView against another checkout's (``baseline``), drawing
    the same growing history, redraw by redraw, alternating which goes first: thread CPU ms per
    redraw and the axes drawn again (limit changes). E-step times carry 30% noise, as on a busy
    host; this checkout's view also gets the earlier steps' times, as its EMPanel passes them.
    After the history: Back to 3 steps, then Reset."""
    package = baseline_package(baseline)
    base_em = importlib.import_module(f"{package}.widgets.em_view")
    base_loss = importlib.import_module(f"{package}.widgets.loss_view")
    x, model, models, densities = em_history(redraws)
    rng = np.random.default_rng(3)
    seconds = [list(0.01 * np.exp(0.3 * rng.standard_normal(2))) for _ in range(redraws)]
    loss_frame = loss_history(redraws)
    views = {
        "baseline": (base_em.EMView(model, x, distributed=True), base_loss.LossView(entropy_floor=1.1)),
        "this": (EMView(model, x, distributed=True), LossView(entropy_floor=1.1)),
    }
    redrawn = {(who, panel): 0 for who in views for panel in ("EMPanel", "TrainPanel")}
    for who, pair in views.items():
        for panel, view in zip(("EMPanel", "TrainPanel"), pair):

            def counted(ax=None, *changed, _key=(who, panel), _invalidate=view.live.invalidate):
                redrawn[_key] += 1
                _invalidate(ax, *changed)

            view.live.invalidate = counted
    cpu: dict = {key: [] for key in redrawn}
    frames = [(i, i) for i in range(1, redraws + 1)] + [(3, redraws), (0, redraws)]  # then Back to 3, Reset
    for n, (steps, reports) in enumerate(frames):
        for who in ("this", "baseline") if n % 2 else ("baseline", "this"):
            em, loss = views[who]
            earlier = {"earlier_seconds": seconds[max(0, steps - 20) : max(0, steps - 1)]} if who == "this" else {}
            last = seconds[steps - 1] if steps else []
            cpu[(who, "EMPanel")].append(
                timed(lambda em=em, s=steps, t=last, e=earlier: em.render(densities[:s], models[s], t, **e))[0]
            )
            cpu[(who, "TrainPanel")].append(timed(lambda loss=loss, r=reports: loss_frame(loss, r))[0])
    print(f"\nViews against {baseline}'s, a growing {redraws}-step history then Back and Reset, interleaved")
    print(f"{'panel':<10} {'':<9} {'CPU med':>8} {'CPU mean':>9} {'CPU total':>10} {'axes redrawn':>13}")
    for panel in ("EMPanel", "TrainPanel"):
        for who in ("baseline", "this"):
            ms = 1e3 * np.array(cpu[(who, panel)])
            print(
                f"{panel:<10} {who:<9} {np.median(ms):>8.1f} {ms.mean():>9.1f} {ms.sum():>10.0f} "
                f"{redrawn[(who, panel)]:>13}"
            )


def live_figure_ab(baseline: str, repeats: int = 15) -> None:
    """This checkout's LiveFigure against another checkout's (``baseline``; given a change it
    does not know, it redraws the whole axes), on the EM panel's figure, in this process,
    alternating which goes first: thread CPU ms of the first draw, a redraw with only the
    dynamic artists changed, one axes drawn again whole, the step axes widened from 10 steps to
    320 (new limits), and widened again to limits they had."""
    module = importlib.import_module(f"{baseline_package(baseline)}.widgets.live_figure")

    class Baseline(module.LiveFigure):
        def invalidate(self, ax=None, changed="all"):  # a change it does not know: the whole axes
            super().invalidate(ax, *([changed] if changed in getattr(module, "CHANGES", {}) else []))

    x, model, models, densities = em_history(16)
    seconds = [0.01, 0.012]
    cases = ("first draw", "dynamic only", "one axes whole", "widen to new limits", "widen to kept limits")
    times = {case: {"this": [], "baseline": []} for case in cases}
    figures = (("this", em_view.LiveFigure), ("baseline", Baseline))
    for i in range(repeats):
        for who, figure_class in figures if i % 2 else figures[::-1]:
            kept_class, em_view.LiveFigure = em_view.LiveFigure, figure_class  # EMView builds its figure from it
            try:
                view = EMView(model, x, distributed=True)
            finally:
                em_view.LiveFigure = kept_class

            def render(step, axis_steps=None):
                return view.render(densities[:10], models[step], seconds, axis_steps=axis_steps)

            steps = (
                (None, lambda: render(10)),
                (None, lambda: render(11)),
                (lambda: view.live.invalidate(view.objective), lambda: render(12)),
                (None, lambda: render(13, axis_steps=300)),
                (lambda: render(14), lambda: render(15, axis_steps=300)),
            )  # back to 10 steps, then 320 again
            for case, (untimed, timed_render) in zip(cases, steps):
                if untimed is not None:
                    untimed()
                times[case][who].append(timed(timed_render)[0])
    print(f"\nLiveFigure against {baseline}'s, the EM panel's figure, median thread CPU ms of {repeats}, interleaved")
    print(f"{'redraw':<22} {'baseline':>9} {'this':>9} {'this/baseline':>14}")
    for case in cases:
        base, this = (1e3 * statistics.median(times[case][who]) for who in ("baseline", "this"))
        print(f"{case:<22} {base:>9.1f} {this:>9.1f} {this / base:>14.2f}")


def make_handle():
    from mixle_nb.cluster.rank_side import rank_namespace
    from mixle_nb.parallel import TorchRunEncodedData

    ns = rank_namespace()
    ns["bench_h"] = TorchRunEncodedData(ns["bench_x"], estimator=ns["bench_est"])


def drop_handle():
    from mixle_nb.cluster.rank_side import rank_namespace

    rank_namespace().pop("bench_h").close()


def own_steps_on_rank(n: int) -> float:
    """Seconds per EM step of ``n`` steps run on the rank in one call (no client in between)."""
    import time as _time

    from mixle_nb.cluster.rank_side import lookup
    from mixle_nb.stats.estimation import em_step as _em_step

    h, est, model = lookup("bench_h"), lookup("bench_est"), lookup("bench_start")
    t0 = _time.perf_counter()
    for _ in range(n):
        model = _em_step(h, est, model).model
    return (_time.perf_counter() - t0) / n


def panel_step_seconds(panel: EMPanel, steps: int) -> tuple[float, float, float, float]:
    """(wall seconds per step of ``panel.run(steps)`` from the start model, steps per call,
    seconds of the final draw that ``run`` ends with, CPU seconds this process (the notebook's
    stand-in: its worker, redraws and ipyparallel's threads) spent on the run), ``run(steps)`` being
    ``run(steps, block=False)`` then ``wait()``, which draws the final state. The reset before
    it fits the step axes to no steps, so the run widens them again (once or twice: they also
    hold the steps of the run's next 2 s), to x axes kept from the rounds before, as Reset then
    Run N again does in a notebook."""
    panel.reset()
    panel.flush()  # the reset's redraw now, not inside the timed run
    calls = panel.step_calls
    cpu, t0 = time.process_time(), time.perf_counter()
    panel.run(steps, block=False)
    while panel.running:
        time.sleep(0.01)
    t1 = time.perf_counter()
    panel.wait()
    t2 = time.perf_counter()
    assert panel.error is None and len(panel.history) == steps, panel.error
    return (t2 - t0) / steps, steps / (panel.step_calls - calls), t2 - t1, time.process_time() - cpu


def local_panel(package: str, x: np.ndarray, settings: dict):
    """A local EMPanel of ``package`` (``mixle_nb`` or a baseline's) on ``x`` from the start of
    ``settings`` (a one-iteration fit's), one step taken (the first builds what the panel keeps)."""
    mixture = importlib.import_module(f"{package}.mixture")
    widgets = importlib.import_module(f"{package}.widgets")
    model = mixture.GaussianMixture(max_iter=1, **settings).fit(x)._model()
    estimator = mixture.GaussianMixture(settings["n_components"]).mixture_estimator(x.shape[1])
    panel = widgets.EMPanel(handle=x, estimator=estimator, model=model)
    panel.step()
    return panel


def outside_em_seconds(package: str, panel, steps: int, rounds: int) -> float:
    """CPU seconds a step of the local ``panel`` (of ``package``) spends outside EM: its
    ``em_step`` replaced by a copy of one step's record, best of ``rounds`` runs of ``steps``."""
    import copy

    from sklearn_api_bench import cpu_seconds

    estimation = importlib.import_module(f"{package}.stats.estimation")
    real = estimation.em_step
    record = real(panel.ranks.namespace["handle"], panel.ranks.namespace["estimator"], panel.start_model)
    estimation.em_step = lambda enc, estimator, model: copy.copy(record)
    try:
        best = min(cpu_seconds(lambda: [panel.step() for _ in range(steps)]) for _ in range(rounds))
    finally:
        estimation.em_step = real
    panel.reset()
    return best / steps


def local_bench(rounds: int, steps: int, baseline: str | None) -> Table:
    """Thread CPU ms a step at N = 1,000, D = 2, K = 3 (full): a scikit-learn iteration, our EM
    step alone, the local panel's step (and a baseline checkout's), interleaved, best of ``rounds``."""
    import warnings

    from sklearn.exceptions import ConvergenceWarning
    from sklearn.mixture import GaussianMixture as ScikitGaussianMixture
    from sklearn_api_bench import cpu_seconds
    from sklearn_api_bench import problem as sklearn_problem

    warnings.simplefilter("ignore", ConvergenceWarning)
    x, start = sklearn_problem(1_000, 2, 3)
    settings = dict(n_components=3, covariance_type="full", tol=0, **start)
    packages = {"mixle_nb": "mixle_nb"} | ({"baseline": baseline_package(baseline)} if baseline else {})
    panels = {name: local_panel(package, x, settings) for name, package in packages.items()}
    panel = panels["mixle_nb"]
    enc, estimator = panel.ranks.namespace["handle"], panel.ranks.namespace["estimator"]

    def sklearn_iteration() -> float:
        low = cpu_seconds(lambda: ScikitGaussianMixture(max_iter=2, **settings).fit(x))
        high = cpu_seconds(lambda: ScikitGaussianMixture(max_iter=2 + steps, **settings).fit(x))
        return (high - low) / steps

    def em_steps() -> None:
        model = panel.start_model
        for _ in range(steps):
            model = em_step(enc, estimator, model).model

    def panel_steps(stepped: EMPanel):
        return lambda: [stepped.step() for _ in range(steps)]

    timed_steps = {"EM step alone (em_step)": em_steps} | {
        f"local EMPanel.step ({name})": panel_steps(p) for name, p in panels.items()
    }
    reset = {f"local EMPanel.step ({name})": p.reset for name, p in panels.items()}
    contenders = ["scikit-learn iteration", *timed_steps]
    times: dict[str, list[float]] = {name: [] for name in contenders}
    for r in range(rounds):
        for name in contenders[r % len(contenders) :] + contenders[: r % len(contenders)]:  # each goes first in turn
            if name == "scikit-learn iteration":
                times[name].append(sklearn_iteration())
                continue
            reset.get(name, lambda: None)()  # every panel steps from the start, as em_step does
            times[name].append(cpu_seconds(timed_steps[name]) / steps)
    best = {name: 1e3 * min(t) for name, t in times.items()}
    outside = {
        f"local EMPanel.step ({name})": 1e3 * outside_em_seconds(packages[name], p, steps, rounds)
        for name, p in panels.items()
    }
    em_alone = best["EM step alone (em_step)"]
    table = Table(
        f"N = 1,000, D = 2, K = 3 (full), one thread: CPU ms a step, best of {rounds} interleaved rounds of {steps}",
        ["step", "ms", "/ scikit-learn iteration", "over the EM step alone ms", "outside EM ms"],
    )
    for name, ms in best.items():
        over = ms - em_alone if name in outside else None
        table.add(name, ms, ms / best["scikit-learn iteration"], over, outside.get(name))
        extra = (
            f", {1e3 * over:.0f} us over the EM step alone, {1e3 * outside[name]:.0f} us outside EM"
            if over is not None
            else ""
        )
        print(f"{name:<38} {ms:7.3f} ms  {ms / best['scikit-learn iteration']:5.2f}x scikit-learn's{extra}")
    return table


def pin_cores() -> None:
    """Both engines on core 0; this process (the notebook's stand-in) and the controller on
    core 1: a host where the notebook does not share the ranks' cores, emulated on two."""
    processes = [psutil.Process(), *psutil.Process().children(recursive=True)]
    for p in processes:
        command = " ".join(p.cmdline())
        core = 0 if "ipyparallel.engine" in command and "nanny" not in command else 1
        for thread in p.threads():  # threads started later inherit their creator's cores
            os.sched_setaffinity(thread.id, {core})


def run_bench(cluster: MixleCluster, n_obs: int, steps: int, rounds: int) -> dict:
    x, start = problem(n_obs)
    cluster.push(bench_x=x, bench_est=start.estimator(), bench_start=start)
    cluster.run(make_handle)
    batched = EMPanel(cluster, handle="bench_h", estimator="bench_est", model=start)
    one_a_call = EMPanel(cluster, handle="bench_h", estimator="bench_est", model=start, batch_seconds=0)
    times: dict = {
        name: []
        for name in (
            "ranks",
            "bare",
            "one a call",
            "batched",
            "steps/call",
            "final draw",
            "notebook CPU",
            "bare/ranks",
            "one a call/ranks",
            "batched/ranks",
        )
    }
    cluster.run(own_steps_on_rank, 2)  # warm every path
    batched.run(2)
    one_a_call.run(2)
    for _ in range(rounds):
        own_before = max(cluster.run(own_steps_on_rank, steps))
        t0 = time.perf_counter()
        for _ in range(steps):  # one call per step, nothing drawn: the client's round trip alone
            cluster.run(em_step_on_rank, "bench_h", "bench_est", "bench_start")
        bare = (time.perf_counter() - t0) / steps
        one = panel_step_seconds(one_a_call, steps)[0]
        per_step, per_call, final_draw, notebook_cpu = panel_step_seconds(batched, steps)
        own = (own_before + max(cluster.run(own_steps_on_rank, steps))) / 2  # before and after the rest
        # ratios within a round: the machine's load drifts between rounds more than within one
        for name, value in (
            ("ranks", own),
            ("bare", bare),
            ("one a call", one),
            ("batched", per_step),
            ("steps/call", per_call),
            ("final draw", final_draw),
            ("notebook CPU", notebook_cpu),
            ("bare/ranks", bare / own),
            ("one a call/ranks", one / own),
            ("batched/ranks", per_step / own),
        ):
            times[name].append(value)
    cluster.run(drop_handle)
    medians = {name: statistics.median(values) for name, values in times.items()}
    by_round = {f"{name}, by round": times[name] for name in ("batched/ranks", "notebook CPU")}
    return medians | by_round


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--redraws", type=int, default=200)
    parser.add_argument("--steps", type=int, default=200, help="EM steps per timed run")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--skip-redraw", action="store_true", help="only the Run N comparison")
    parser.add_argument(
        "--baseline", metavar="DIR", help="also time another checkout's LiveFigure against this one's, in this process"
    )
    parser.add_argument(
        "--pin", action="store_true", help="engines on core 0, this process and the controller on core 1"
    )
    parser.add_argument("--local", action="store_true", help="the local panel's step at N = 1,000 instead")
    add_json_argument(parser, "panel_bench")
    args = parser.parse_args()
    if args.local:
        import torch
        from threadpoolctl import threadpool_limits

        torch.set_num_threads(1)
        threadpool_limits(1)
        table = local_bench(args.rounds, args.steps, args.baseline)
        write_results(args.json, "panel_bench", 1, [table])
        return
    if not args.skip_redraw:
        redraw_bench(args.redraws)
    if args.baseline:
        views_ab(args.baseline, args.redraws)
        live_figure_ab(args.baseline)
    print(
        f"\npanel.run({args.steps}) per step against the ranks' own step, 2 engines"
        f"{' on core 0, the notebook and controller on core 1' if args.pin else ''}, "
        f"median of {args.rounds} interleaved rounds, ratios taken within each round (target at N=1e6: <= 1.1x)"
    )
    print(
        "ms per step: the ranks' own; one bare cluster.run a step; the panel at one step a call; "
        "the panel batched (steps/call: its mean; draw: ms of the final draw run() ends with; "
        "nb CPU: ms of this process's CPU during the batched run)"
    )
    print(
        f"{'N':>9} {'ranks':>8} {'run()':>8} {'1/call':>8} {'batched':>8} {'steps/call':>10} {'draw':>6} "
        f"{'nb CPU':>7} {'run()/ranks':>11} {'1/call/ranks':>12} {'batched/ranks':>13}"
    )
    rounds = []
    with MixleCluster(2) as cluster:
        if args.pin:
            pin_cores()
        for n_obs in (1_000_000, 1_000):
            t = run_bench(cluster, n_obs, args.steps, args.rounds)
            print(
                f"{n_obs:>9,} {t['ranks'] * 1e3:>8.2f} {t['bare'] * 1e3:>8.2f} {t['one a call'] * 1e3:>8.2f} "
                f"{t['batched'] * 1e3:>8.2f} {t['steps/call']:>10.1f} {t['final draw'] * 1e3:>6.0f} "
                f"{t['notebook CPU'] * 1e3:>7.0f} "
                f"{t['bare/ranks']:>11.2f} {t['one a call/ranks']:>12.2f} {t['batched/ranks']:>13.2f}"
            )
            rounds.append((n_obs, t["batched/ranks, by round"], t["notebook CPU, by round"]))
    for n_obs, ratios, cpu in rounds:  # the spread the medians hide: this machine's load drifts
        print(f"batched/ranks at N={n_obs:,}, by round: {' '.join(f'{r:.2f}' for r in ratios)}")
        print(f"notebook CPU ms at N={n_obs:,}, by round: {' '.join(f'{1e3 * c:.0f}' for c in cpu)}")


if __name__ == "__main__":
    main()
