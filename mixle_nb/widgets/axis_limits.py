"""Axes limits that fit what the panels show, from the first point on.

A value axis is fitted to the values with headroom, and kept while it still fits them: while
nothing is clipped and the values span at least :data:`FILL` of it. When values pass a limit
(a history growing), the axis widens past them by :data:`HEADROOM` of their span on that side,
so a history whose span grows by a factor ``r`` changes the limits about ``log(r) / log(1.75)``
times. When the values have moved or shrunk (Back, Reset, a new model, a window moving on), the
axis narrows to them. Each change costs one axes redraw (see :class:`~.live_figure.LiveFigure`),
so limits are changed only when they must be.

A step axis (:func:`fit_steps`) runs from step 1 to 10, 20, 40, ...: doubling, so the steps fill
more than half of it.
"""

from __future__ import annotations

import math

import numpy as np
from matplotlib.axes import Axes
from numpy.typing import ArrayLike

FILL = 0.5  # the least share of its axis the values span; less, and the axis narrows to them
MARGIN = 0.05  # of the values' span, beyond them on either side: a curve never touches the frame
HEADROOM = 0.7  # of the span, beyond the side the values grew past: they fill 56% of the axis then
FRESH_ROOM = 0.2  # of the span, on either side of values fitted afresh (or narrowed to): 67%
RELATIVE_MIN_SPAN = 1e-3  # the least span, of the values' magnitude: one value gets readable ticks
LOG_MIN_DECADES = 2.0  # the least span of a log axis, in decades: at least two decade ticks

Limits = tuple[float, float]


def fitted_limits(
    lo: float, hi: float, current: Limits, floor: float | None = None, min_span: float | None = None
) -> Limits | None:
    """New limits for values from ``lo`` to ``hi`` on an axis at ``current``, or None to keep it.

    Parameters
    ----------
    lo, hi : float
        The smallest and largest value shown (``lo <= hi``).
    current : tuple of float
        The axis' limits now.
    floor : float, optional
        The lowest limit allowed (0 for densities and bars, which stand on it).
    min_span : float, optional
        The least span given to the values (centred on them); by default
        :data:`RELATIVE_MIN_SPAN` of their magnitude.

    Returns
    -------
    tuple of float or None
        ``(low, high)`` holding the values with :data:`MARGIN` and :data:`HEADROOM` (or
        :data:`FRESH_ROOM`), spanned by them at least :data:`FILL`; None when ``current``
        already holds them that way.
    """
    if min_span is None:
        min_span = RELATIVE_MIN_SPAN * max(abs(lo), abs(hi)) or 1.0
    span = max(hi - lo, min_span)
    cur_lo, cur_hi = current
    below, above = lo < cur_lo, hi > cur_hi
    if not (below or above) and span >= FILL * (cur_hi - cur_lo):
        return None
    if floor is not None:
        floor = min(floor, lo)
    centre = 0.5 * (lo + hi)  # a span widened to the least one stays centred on the values
    lo, hi = min(lo, centre - 0.5 * span), max(hi, centre + 0.5 * span)
    grew = (below != above) and cur_lo <= hi and lo <= cur_hi  # past one side, not a jump elsewhere
    room_lo, room_hi = (HEADROOM * below, HEADROOM * above) if grew else (FRESH_ROOM, FRESH_ROOM)
    if floor is not None and lo - (MARGIN + room_lo) * span < floor:  # values standing on the floor:
        room_lo, room_hi = 0.0, room_lo + room_hi  # the headroom goes above them
    new_lo, new_hi = lo - (MARGIN + room_lo) * span, hi + (MARGIN + room_hi) * span
    if grew:  # the other side stays where it is (if beyond the margin), if the values still fill the axis
        kept = (new_lo, max(cur_hi, new_hi)) if below else (min(cur_lo, new_lo), new_hi)
        if hi - lo >= FILL * (kept[1] - kept[0]):
            new_lo, new_hi = kept
    if floor is not None:
        new_lo = max(new_lo, floor)
    return new_lo, new_hi


def fit_limits(
    ax: Axes,
    values: ArrayLike,
    axis: str = "y",
    log: bool = False,
    floor: float | None = None,
    min_span: float | None = None,
) -> bool:
    """Fit ``ax``'s ``axis`` limits to ``values`` (see :func:`fitted_limits`).

    Parameters
    ----------
    ax : matplotlib.axes.Axes
        The axes whose limits to fit.
    values : array_like of float
        What the axes shows along ``axis``; non-finite values (and, on a log axis, values not
        above 0) are left out. With none left, the limits are kept.
    axis : {"y", "x"}
        Which limits.
    log : bool
        The axis has a log scale: the values are fitted in decades.
    floor : float, optional
        The lowest limit allowed (on a linear axis).
    min_span : float, optional
        The least span given to the values, in decades on a log axis (:data:`LOG_MIN_DECADES`
        where the axis has no minor ticks to label).

    Returns
    -------
    bool
        Whether the limits changed (the caller then redraws the axes' background).
    """
    v = np.asarray(values, dtype=float).ravel()
    v = v[np.isfinite(v)]
    if log:
        v = np.log10(v[v > 0])
    if v.size == 0:
        return False
    get, set_ = (ax.get_ylim, ax.set_ylim) if axis == "y" else (ax.get_xlim, ax.set_xlim)
    low, high = get()
    current = (math.log10(low), math.log10(high)) if log else (low, high)
    limits = fitted_limits(float(v.min()), float(v.max()), current, None if log else floor, min_span)
    if limits is None:
        return False
    set_(*(float(10.0**b) for b in limits) if log else limits)
    return True


def fit_steps(ax: Axes, n: int) -> bool:
    """Fit a per-step axis to ``n`` steps: 1..10, then doubling.

    The steps fill more than half the axis at every ``n``, and a run of ``n`` steps changes the
    limits only about ``log2(n / 10)`` times; fewer steps (Back, Reset) fit again.

    Parameters
    ----------
    ax : matplotlib.axes.Axes
        The axes whose x limits to fit.
    n : int
        The steps to hold.

    Returns
    -------
    bool
        Whether the limits changed.
    """
    top = 10
    while top < n:
        top *= 2
    if ax.get_xlim() == (0.5, top + 0.5):
        return False
    ax.set_xlim(0.5, top + 0.5)
    return True
