"""What a panel's figure holds, read from the notebook's kernel: the browser tests assert on the
artists' data and the axes' limits, not on how a screenshot looks."""

from __future__ import annotations

RANK_AXIS_MAX_HEADROOM = 15  # fit_limits keeps a y axis up to 10x a fit of 1.25x the tallest bar


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
    """The rank bars are the last step's E-step milliseconds, on a y axis from 0 scaled to them."""
    heights, ms = page.kernel_value(
        f"([float(b.get_height()) for b in {panel}.view.bars], [1e3 * s for s in {panel}.history[-1].rank_seconds])"
    )
    assert heights == ms and min(ms) > 0, (heights, ms)
    low, high = axis_limits(page, f"{panel}.view.ranks", "y")
    assert low == 0.0 and max(ms) <= high <= RANK_AXIS_MAX_HEADROOM * max(ms), (ms, high)
    assert "ms" in page.kernel_value(f"{panel}.view.ranks.get_title()")
