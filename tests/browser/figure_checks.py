"""What a panel's figure holds, read from the notebook's kernel: the browser tests assert on the
artists' data and the axes' limits, not on how a screenshot looks."""

from __future__ import annotations


def axis_limits(page, axes: str, axis: str = "x") -> tuple[float, float]:
    """The limits of ``axes`` (an expression in the kernel) along ``axis``."""
    return tuple(page.kernel_value(f"tuple(map(float, {axes}.get_{axis}lim()))"))


def assert_curve_fits_the_steps(page, panel: str, steps: int) -> None:
    """An EM panel's curve holds every step's log-density, and both step axes end within twice
    the steps taken (at 10 below ten steps)."""
    assert (
        page.kernel_value(
            f"[float(v) for v in {panel}.view.objective_line.get_ydata()] == [r.log_density for r in {panel}.history]"
        )
        is True
    )
    assert page.kernel_value(f"len({panel}.history)") == steps
    for axes in ("objective", "convergence"):
        low, high = axis_limits(page, f"{panel}.view.{axes}")
        assert low == 0.5 and max(steps, 10) <= high - 0.5 <= max(2 * steps, 10), (axes, steps, high)


def assert_rank_bars_in_ms(page, panel: str) -> None:
    """The rank bars are the last step's E-step milliseconds, on a y axis from 0 that holds them
    and that the tallest of the recent steps' (``TIMED_STEPS``) spans at least half of."""
    heights, ms = page.kernel_value(
        f"([float(b.get_height()) for b in {panel}.view.bars], [1e3 * s for s in {panel}.history[-1].rank_seconds])"
    )
    assert heights == ms and min(ms) > 0, (heights, ms)
    low, high = axis_limits(page, f"{panel}.view.ranks", "y")
    recent = page.kernel_value(
        f"max(1e3 * s for r in {panel}.history[-__import__('mixle_nb.widgets.em_panel').widgets.em_panel.TIMED_STEPS:] "
        "for s in r.rank_seconds)"
    )
    assert low == 0.0 and max(ms) <= high <= 2 * recent, (ms, recent, high)
    assert "ms" in page.kernel_value(f"{panel}.view.ranks.get_title()")


def drawn_range(page, panel: str, axes: str, values: str) -> tuple[float, float, float, float]:
    """``axes``' y limits and the least and greatest of ``values`` (an expression in the kernel:
    y data drawn, the non-finite left out), in decades on a log axis, read under the panel's
    redraw lock so that no redraw is half done."""
    return tuple(
        page.kernel_value(
            f"(lambda lock, ax, v: (lock.acquire(), "
            f"[float(__import__('math').log10(b)) if ax.get_yscale() == 'log' else float(b) "
            f"for b in (*ax.get_ylim(), min(v, default=float('nan')), max(v, default=float('nan')))], "
            f"lock.release())[1])({panel}._redraw_lock, {axes}, "
            f"[y for y in map(float, {values}) if abs(y) < float('inf')])"
        )
    )


def assert_not_clipped(page, panel: str, axes: str, values: str, what: str) -> tuple[float, float, float, float]:
    """``values`` (y data drawn on ``axes``) lie within its y limits; the range (see :func:`drawn_range`)."""
    low, high, least, most = drawn_range(page, panel, axes, values)
    assert low <= least and most <= high, f"{what} clipped: {least}..{most} drawn on {low}..{high}"
    return low, high, least, most


def assert_fills_its_axes(page, panel: str, axes: str, values: str, what: str, least_span: float = 0.0) -> None:
    """``values`` (y data drawn on ``axes``) are not clipped and span at least half of its
    height (or, spanning less than ``least_span``, ``least_span`` does)."""
    low, high, least, most = assert_not_clipped(page, panel, axes, values, what)
    span = max(most - least, least_span)
    assert span >= 0.5 * (high - low), f"{what} spans {(most - least) / (high - low):.0%} of its axes"


def assert_em_axes_fit(page, panel: str) -> None:
    """An EM panel's model density spans at least half of the picture's height (the histogram
    not clipped), and its log-density and gain curves half of theirs (the gains, spanning less
    than the least span of a log axis, that span), once they have two points."""
    picture = f"{panel}.view.picture"
    assert_fills_its_axes(page, panel, f"{picture}.ax", f"{picture}.line.get_ydata()", "the model's density")
    assert_not_clipped(page, panel, f"{picture}.ax", f"[{picture}._histogram_top]", "the histogram")
    steps = page.kernel_value(f"len({panel}.view.objective_line.get_ydata())")
    if steps >= 2:
        line = f"{panel}.view.objective_line.get_ydata()"
        assert_fills_its_axes(page, panel, f"{panel}.view.objective", line, "the log-density")
    if page.kernel_value(f"int(sum(g > 0 for g in {panel}.view.gain_line.get_ydata()))") >= 2:
        line = f"{panel}.view.gain_line.get_ydata()"
        decades = page.kernel_value("__import__('mixle_nb.widgets.axis_limits').widgets.axis_limits.LOG_MIN_DECADES")
        assert_fills_its_axes(page, panel, f"{panel}.view.convergence", line, "the gain", least_span=decades)


LOSSES_DRAWN = "[y for l in (*{0}.view.raw.values(), {0}.view.mean, {0}.view.held_out) for y in l.get_ydata()]"


def assert_loss_axes_fit(page, panel: str) -> None:
    """A training panel's losses (each rank's, the mean, the held-out points) span at least
    half of the loss axis' height, none clipped."""
    assert_fills_its_axes(page, panel, f"{panel}.view.ax", LOSSES_DRAWN.format(panel), "the losses")
