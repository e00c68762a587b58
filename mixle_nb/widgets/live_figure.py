"""A Matplotlib figure kept between redraws and rendered by blitting.

Most of a full Agg draw goes into axes, ticks and text (about 90% of 70-180 ms on a busy
2-core machine). A ``LiveFigure`` draws those once into a background, then each redraw
restores it and draws only the *dynamic* artists (lines, bars, ellipses) before encoding the
PNG: a few milliseconds. The background is redrawn only when a view's limits or static
content change; :func:`fit_limits` widens limits with headroom so that happens rarely.

PNG bytes work the same in JupyterLab, VS Code and nbconvert, and a saved notebook keeps only
the last one. No pyplot backend is selected, so the notebook's own (inline) backend is left alone.
"""
from __future__ import annotations

import math
import struct
import zlib
from typing import Optional

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

DPI = 72
PNG_COMPRESS_LEVEL = 1  # zlib level 1: fastest; a plot's mostly flat rows compress well anyway
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


class LiveFigure:
    """A figure whose static parts are drawn once and whose dynamic artists are redrawn."""

    def __init__(self, figsize: tuple[float, float]):
        self.figure = Figure(figsize=figsize, dpi=DPI)
        self.canvas = FigureCanvasAgg(self.figure)
        self._dynamic: list = []
        self._background = None
        self._stale: set = set()  # axes whose static content changed since the background
        self._extents: dict = {}  # axes -> the pixel box its static content covered when drawn

    def dynamic(self, artist):
        """Mark ``artist`` as redrawn on every render (it is left out of the background)."""
        artist.set_animated(True)
        self._dynamic.append(artist)
        return artist

    def forget(self, artists) -> None:
        """Remove dynamic artists from the figure (a view rebuilding its picture). The
        background never holds them, so it stays valid."""
        for artist in artists:
            if artist in self._dynamic:
                self._dynamic.remove(artist)
            artist.remove()

    def invalidate(self, ax=None) -> None:
        """Static content or limits changed (of ``ax`` only, or of the whole figure): the next
        render redraws that part of the background."""
        if ax is None:
            self._background = None
        else:
            self._stale.add(ax)

    def png(self) -> bytes:
        if self._background is None:
            self.canvas.draw()  # animated (dynamic) artists are skipped here
            self._remember_extents()
            self._background = self.canvas.copy_from_bbox(self.figure.bbox)
        else:
            self.canvas.restore_region(self._background)
            if self._stale:
                self._redraw_stale()
        for artist in self._dynamic:
            if artist.get_visible() and artist.axes is not None:
                artist.axes.draw_artist(artist)
        return encode_png(self.canvas.buffer_rgba())

    def _remember_extents(self) -> None:
        renderer = self.canvas.get_renderer()
        self._extents = {ax: ax.get_tightbbox(renderer) for ax in self.figure.axes}
        self._stale.clear()

    def _redraw_stale(self) -> None:
        """Blank the stale axes' old and new boxes, draw their static content, keep the result
        as the background: a quarter of a full draw when one of four views changed."""
        renderer = self.canvas.get_renderer()
        pixels = np.asarray(self.canvas.buffer_rgba())
        height, width = pixels.shape[:2]
        for ax in self._stale:
            new = ax.get_tightbbox(renderer)  # what the draw below covers: the costly half, measured once
            for box in (self._extents.get(ax), new):
                if box is not None:
                    x0, x1 = max(int(box.x0) - 1, 0), min(int(math.ceil(box.x1)) + 1, width)
                    y0, y1 = max(height - int(math.ceil(box.y1)) - 1, 0), min(height - int(box.y0) + 1, height)
                    pixels[y0:y1, x0:x1] = 255
            self._extents[ax] = new
        for ax in self._stale:
            ax.draw(renderer)
        self._stale.clear()
        self._background = self.canvas.copy_from_bbox(self.figure.bbox)



def encode_png(rgba) -> bytes:
    """PNG of the RGB part of an RGBA buffer, written directly: every row with PNG's "up"
    filter (a row minus the row above, which leaves mostly zeros in a plot) and zlib level 1.
    Half the time of PIL's encoder at its fastest level, for files of the same size."""
    pixels = np.asarray(rgba)[..., :3]
    height, width = pixels.shape[:2]
    rows = np.empty((height, 1 + 3 * width), dtype=np.uint8)
    rows[:, 0] = 2  # filter type "up"
    flat = pixels.reshape(height, 3 * width)
    rows[0, 1:] = flat[0]
    np.subtract(flat[1:], flat[:-1], out=rows[1:, 1:])  # modulo 256, as the filter defines
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)  # 8-bit RGB, no interlace
    return (PNG_SIGNATURE + _png_chunk(b"IHDR", header)
            + _png_chunk(b"IDAT", zlib.compress(rows, PNG_COMPRESS_LEVEL)) + _png_chunk(b"IEND", b""))


def _png_chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def static_png(fig: Figure) -> bytes:
    """One full render of a figure that is drawn once (not live)."""
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    return encode_png(canvas.buffer_rgba())


def fit_limits(ax, values, axis: str = "y", log: bool = False, floor: Optional[float] = None,
               shrink: bool = True) -> bool:
    """Make the axis' limits cover ``values`` (finite ones; positive ones on a log axis), with
    headroom so that later values rarely force a change. Returns whether the limits changed
    (the caller then invalidates the background). With ``shrink``, limits also shrink once they
    are more than ten times what a fit would give, so a converged curve does not stay a flat
    line at the edge; without it (a history that only grows) they only ever widen."""
    v = np.asarray(values, dtype=float)
    v = v[np.isfinite(v)]
    if log:
        v = np.log10(v[v > 0])
    if v.size == 0:
        return False
    lo, hi = float(v.min()), float(v.max())
    get, set_ = (ax.get_ylim, ax.set_ylim) if axis == "y" else (ax.get_xlim, ax.set_xlim)
    cur_lo, cur_hi = (math.log10(b) if log else b for b in get())
    span = hi - lo
    pad = max(0.25 * span, 2.0 if log else 1e-9 * max(abs(lo), abs(hi), 1.0))  # log: two decades
    # measured against what a fit would give, not the values' span alone: a single value (span 0)
    # would otherwise re-fit, and redraw the axes' background, at every render
    if cur_lo <= lo and hi <= cur_hi and (not shrink or cur_hi - cur_lo <= 10 * (span + 2 * pad)):
        return False
    new_lo, new_hi = lo - pad, hi + pad
    if log:
        new_lo, new_hi = math.floor(new_lo), math.ceil(new_hi)
        new_lo, new_hi = 10.0 ** new_lo, 10.0 ** new_hi
    if floor is not None:
        new_lo = max(new_lo, floor)
    set_(new_lo, new_hi)
    return True


def fit_steps(ax, n: int) -> bool:
    """x limits for a per-step plot of ``n`` steps: 1..10, then doubling, so the steps fill more
    than half the axis at every ``n``, and a run of ``n`` steps redraws the background for
    them only about log2(n / 10) times. Fewer steps (Back, Reset) fit again."""
    top = 10
    while top < n:
        top *= 2
    if ax.get_xlim() == (0.5, top + 0.5):
        return False
    ax.set_xlim(0.5, top + 0.5)
    return True
