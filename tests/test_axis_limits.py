"""The panels' axes fit what they show (issue 42): from the first point on, nothing clipped, the
curve spanning at least half of its axes, narrowing after Back and Reset, and over a long run
limits that change a logarithmic number of times (each change is an axes redraw)."""

from __future__ import annotations

import numpy as np
import pytest
from matplotlib.figure import Figure

from mixle_nb.stats import GaussianDistribution, MixtureDistribution, seq_encode
from mixle_nb.stats.estimation import em_step
from mixle_nb.widgets.axis_limits import FILL, MARGIN, fit_limits, fitted_limits
from mixle_nb.widgets.em_view import EMView
from mixle_nb.widgets.loss_view import LossView


def share(ax, values, axis: str = "y") -> float:
    """The share of ``ax``'s ``axis`` that ``values`` span (in decades on a log axis), after
    checking that none of them is clipped."""
    v = np.asarray(values, dtype=float)
    v = v[np.isfinite(v)]
    lo, hi = ax.get_ylim() if axis == "y" else ax.get_xlim()
    assert lo <= v.min() and v.max() <= hi, f"clipped: {v.min()}..{v.max()} on {lo}..{hi}"
    if (ax.get_yscale() if axis == "y" else ax.get_xscale()) == "log":
        v, lo, hi = np.log10(v), np.log10(lo), np.log10(hi)
    return float((v.max() - v.min()) / (hi - lo))


def em_history(steps: int, n: int = 4000):
    rng = np.random.default_rng(0)
    x = np.concatenate([rng.normal(-2, 1, n // 2), rng.normal(3, 0.7, n - n // 2)])
    start = MixtureDistribution(
        [GaussianDistribution(-1, 1), GaussianDistribution(0.5, 1), GaussianDistribution(2, 1)], [0.3, 0.3, 0.4]
    )
    enc, est = seq_encode(x, model=start), start.estimator()
    models, densities = [start], []
    for _ in range(steps):
        step = em_step(enc, est, models[-1])
        models.append(step.model)
        densities.append(step.log_density)
    return x, models, densities


def loss_points(steps: int, ranks: int = 2, seed: int = 0) -> dict:
    """A character model's loss: 4.5 nats falling fast, then slowly towards 2.2, with noise."""
    rng = np.random.default_rng(seed)
    return {
        r: [
            (5 * s, 5 * s * 128, 2.2 + 2.3 * np.exp(-s / 20) + 0.1 * rng.standard_normal()) for s in range(1, steps + 1)
        ]
        for r in range(ranks)
    }


def test_fitted_limits_hold_the_values_with_headroom_and_are_kept_while_they_fill_half():
    assert fitted_limits(0.0, 1.0, (5.0, 6.0)) == pytest.approx((-0.25, 1.25))  # elsewhere: headroom either side
    assert fitted_limits(0.0, 1.0, (2.0, 3.0), floor=0.0) == pytest.approx((0.0, 1.45))  # on the floor: above
    assert fitted_limits(0.0, 2.0, (-0.25, 1.25)) == pytest.approx((-0.25, 3.5))  # grew above: room there
    assert fitted_limits(0.3, 1.1, (-0.25, 1.25)) is None  # spans 0.8 of 1.5: kept
    assert fitted_limits(0.3, 0.9, (-0.25, 1.25)) == pytest.approx((0.15, 1.05))  # 0.6 of 1.5: narrowed
    lo, hi = fitted_limits(7.0, 7.0, (0.0, 1.0))  # one value: a least span, centred on it
    assert lo < 7.0 < hi and hi - lo == pytest.approx(1.5 * 7e-3)
    assert fitted_limits(7.0, 7.0, (lo, hi)) is None  # then kept


def test_random_histories_are_never_clipped_and_always_fill_half_of_the_axis():
    """Random walks, cut back at random (Back, Reset) and jumping (a new model): after every fit
    the values are within the limits, at least MARGIN of their span from a limit that is not
    the floor, and span at least FILL of the axis."""
    rng = np.random.default_rng(0)
    for trial in range(200):
        ax = Figure().subplots()
        floor = 0.0 if trial % 2 else None
        history: list = []
        for _ in range(100):
            if history and rng.random() < 0.05:
                del history[rng.integers(0, len(history)) :]
            scale = 10.0 ** rng.integers(-3, 4)
            last = history[-1] if history else scale
            history.append(abs(last + scale * rng.standard_normal()) if floor is not None else last + rng.normal())
            changed = fit_limits(ax, history, floor=floor)
            if np.ptp(history) >= 1e-3 * np.abs(history).max():  # else a least span is given them
                assert share(ax, history) >= FILL
            else:
                assert share(ax, history) <= 1.0
            lo, hi = ax.get_ylim()
            if changed and hi - lo > 0:
                span = max(history) - min(history)
                assert max(history) <= hi - 0.999 * MARGIN * span
                assert floor == lo or min(history) >= lo + 0.999 * MARGIN * span


def count_changes(values_by_step, **kwargs) -> list:
    """Fit an axis to a growing history, one value more each step; the steps its limits changed at."""
    ax = Figure().subplots()
    if kwargs.get("log"):
        ax.set_yscale("log")
    return [i for i in range(1, len(values_by_step) + 1) if fit_limits(ax, values_by_step[:i], **kwargs)]


def test_a_long_run_changes_its_limits_a_logarithmic_number_of_times():
    """10,000 steps of a falling, noisy loss, the gains of a converging EM on a log axis, and a
    step count on an x axis: each changes its limits O(log steps) times: as many in the last
    9,000 steps as in the first 1,000 or fewer, and few in all."""
    n = 10_000
    s = np.arange(1, n + 1)
    noise = 0.1 * np.random.default_rng(1).standard_normal(n)
    for values, kwargs in (
        (2.2 + 2.3 * np.exp(-s / 500) + noise, {}),  # a loss: falling and noisy
        (1e3 * 0.97**s, {"log": True}),  # EM's gains, falling geometrically
        (s.astype(float), {"axis": "x", "floor": 0.0}),  # steps (with 0: the loss plot's x axis)
    ):
        changes = count_changes(np.concatenate([[0.0] if kwargs.get("floor") == 0.0 else [], values]), **kwargs)
        late = sum(c > 1000 for c in changes)
        assert len(changes) <= 30 and late <= max(len(changes) - late, 3), (kwargs, changes)


def test_the_em_picture_and_step_axes_fill_after_3_steps_200_steps_back_and_reset():
    """The model's density spans at least half of the picture's height (it sat in the bottom
    fifth of a 0-1 axis), the log-density and gain curves at least half of theirs, none
    clipped, after 3 steps, 200, Back to 3 and Reset."""
    x, models, densities = em_history(200)
    view = EMView(models[0], x, distributed=True)

    def check(steps: int) -> None:
        view.render(densities[:steps], models[steps], [0.01, 0.012] if steps else [])
        picture = view.picture
        assert share(picture.ax, picture.line.get_ydata()) >= FILL, steps
        assert share(picture.ax, [0.0, picture._histogram_top]) <= 1.0  # the histogram is not clipped
        if steps >= 2:
            assert share(view.objective, densities[:steps]) >= FILL, steps
        if steps >= 3:
            assert share(view.convergence, view.gain_line.get_ydata()) >= FILL, steps

    for steps in (3, 200, 3, 0):  # 3 steps, 200 steps, Back to 3, Reset
        check(steps)


def test_the_density_picture_narrows_after_a_peaked_model():
    """A model with a narrow component widens the picture's axis; the model after it, broad
    again, narrows it back, so its density fills the picture again."""
    x, models, _ = em_history(3)
    view = EMView(models[0], x, distributed=False)
    peaked = MixtureDistribution([GaussianDistribution(-2, 1e-3), GaussianDistribution(3, 0.5)], [0.5, 0.5])
    view.render([-1.0], peaked, [0.01])
    assert view.picture.ax.get_ylim()[1] > 5  # the narrow component peaks at 6.3
    view.render([-1.0, -0.5], models[3], [0.01])
    assert share(view.picture.ax, view.picture.line.get_ydata()) >= FILL


def test_rank_bars_fit_the_recent_steps_and_do_not_follow_every_steps_noise():
    """200 steps of E-step times with 30% noise: fitted to the last 20 steps' times, the bars'
    axis changes a few times; fitted to each step's alone, it changes at a fifth of the steps."""
    x, models, _ = em_history(1)
    rng = np.random.default_rng(2)
    times = [list(0.01 * np.exp(0.3 * rng.standard_normal(2))) for _ in range(200)]
    changes = {}
    for recent in (True, False):
        view = EMView(models[0], x, distributed=True)
        limits = []
        for i in range(1, 201):
            view.render(
                [-1.0] * i, models[0], times[i - 1], earlier_seconds=times[max(0, i - 20) : i - 1] if recent else ()
            )
            limits.append(view.ranks.get_ylim())
            assert share(view.ranks, [0.0, *(1e3 * np.asarray(times[i - 1]))]) <= 1.0  # the bars are not clipped
        changes[recent] = sum(a != b for a, b in zip(limits, limits[1:]))
    assert changes[True] <= 6 and changes[False] >= 20, changes


def test_the_loss_plot_fills_after_3_reports_200_reports_a_cut_back_and_a_log_view():
    """Each rank's loss and the mean span at least half of the loss axis (they were a flat line
    in the bottom third of 0-10), nothing clipped, the x axis fitting the steps; the entropy
    floor far below is drawn where it falls, the legend saying it is below the axes."""
    points = loss_points(200)
    for log_scale in (False, True):
        view = LossView(entropy_floor=1.0, log_scale=log_scale)
        for steps in (3, 200, 40):  # 3 reports, 200, cut back to 40 (a resumed checkpoint)
            shown = {r: p[:steps] for r, p in points.items()}
            view.render(shown, [(5 * steps, 5 * steps * 128, 2.6)])
            losses = [y for p in shown.values() for _, _, y in p] + list(view.mean.get_ydata()) + [2.6]
            assert share(view.ax, losses) >= FILL, (log_scale, steps)
            assert share(view.ax, [0.0, 5.0 * steps], axis="x") >= FILL
            below = view.ax.get_ylim()[0] > 1.0
            assert below == (view.floor.get_label() == "entropy floor 1.000 (below the axes)"), steps
            assert below or steps != 3  # after 3 reports the floor, far below, does not squash them
    view.render({r: [(s, t, y - 1.5) for s, t, y in p] for r, p in points.items()}, [])
    assert view.ax.get_ylim()[0] <= 1.0 and view.floor.get_label() == "entropy floor 1.000"


def test_fit_recent_shows_the_late_slow_fall_and_clips_only_the_first_steps():
    """A run whose first steps are far above its later ones: with ``fit_recent`` the y axis fits
    the latest half of the steps (the slow fall, the gap to the held-out points), the earlier
    losses running off the top; the x axis still holds every step."""
    points = loss_points(400)
    held_out = [(5 * s, 5 * s * 128, 2.45) for s in range(100, 401, 100)]
    everything, recent = LossView(), LossView(fit_recent=True)
    for view in (everything, recent):
        view.render(points, held_out)
    late = [y for p in points.values() for s, _, y in p if s >= 1000] + [2.45] * 3
    late += [y for s, y in zip(*recent.mean.get_data()) if s >= 1000]
    assert share(recent.ax, late) >= FILL > share(everything.ax, late)
    assert recent.ax.get_ylim()[1] < max(y for p in points.values() for _, _, y in p)  # the first steps clipped
    assert share(recent.ax, [0.0, 2000.0], axis="x") >= FILL


def test_the_floor_holds_when_the_values_grow_from_an_axis_below_it():
    """Bars of zero height autoscale the axis to a little below 0; when they grow, the axis
    keeps no part of that: it starts at the floor."""
    assert fitted_limits(0.0, 4.0, (-0.05, 0.05), floor=0.0) == pytest.approx((0.0, 7.0))
