"""A Matplotlib figure kept between redraws, its static parts drawn once as layers.

Most of a full Agg draw goes into axes, ticks and text (about 90% of 70-180 ms on a busy
2-core machine). A ``LiveFigure`` draws those once, as layers: the figure's own artists, and
for each axes its x axis, its y axis and the rest of it. Each redraw starts from the layers'
composite and draws only the *dynamic* artists (lines, bars, ellipses) before encoding the PNG:
a few milliseconds. A layer is drawn again only when what it shows changes: when only the x
limits did (a per-step plot growing), the x axis alone, and an x axis is kept for each of the
last limits it had, so limits it returns to (Reset, then Run N again) cost no drawing at all;
when only the y limits did (an axes whose data artists are all dynamic), the y axis alone.
:mod:`.axis_limits` changes limits only when they must, so the axes are rarely drawn again.

PNG bytes work the same in JupyterLab, VS Code and nbconvert, and a saved notebook keeps only
the last one. No pyplot backend is selected, so the notebook's own (inline) backend is left alone.
"""

from __future__ import annotations

import struct
import threading
import zlib
from collections.abc import Iterable
from typing import TypeVar

import numpy as np
from matplotlib.artist import Artist
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg, RendererAgg
from matplotlib.figure import Figure
from numpy.typing import ArrayLike

DPI = 72
# matplotlib's text path (its font cache, mathtext's parser, FreeType) is not thread-safe, and
# panels render on timer and worker threads: every render in this process takes this lock, so two
# panels (or a panel and a test drawing its view) never draw at once.
RENDER_LOCK = threading.Lock()
PNG_COMPRESS_LEVEL = 1  # zlib level 1: fastest; a plot's mostly flat rows compress well anyway
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
# The layers: the figure's own artists (FIGURE); for each axes, its x axis, its y axis and all the
# rest (BODY: patch, spines, title, legend, static artists).
FIGURE, BODY, X_AXIS, Y_AXIS = "figure", "body", "x axis", "y axis"
PARTS = (BODY, X_AXIS, Y_AXIS)
KEPT_X_AXES = 8  # x axis layers kept per axes, for its latest limits (steps 1-10 up to 1-1280)
_A = TypeVar("_A", bound=Artist)
CHANGES = {"all": PARTS, "x limits": (X_AXIS,), "y limits": (Y_AXIS,), "body": (BODY,)}


class LiveFigure:
    """A figure whose static parts are drawn once, as layers, and whose dynamic artists are redrawn."""

    def __init__(self, figsize: tuple[float, float]) -> None:
        self.figure = Figure(figsize=figsize, dpi=DPI)
        self.canvas = FigureCanvasAgg(self.figure)
        self._dynamic: list = []
        self._layers: dict = {}  # (axes or None, part) -> Layer, in the figure's drawing order
        self._stale: set = set()  # keys of layers to draw again
        self._x_axes: dict = {}  # axes -> {x limits: its x axis layer}, the latest KEPT_X_AXES
        self._composite: np.ndarray | None = None  # the layers laid over each other, RGB float
        self._background: np.ndarray | None = None  # the same, RGBA bytes

    def dynamic(self, artist: _A) -> _A:
        """Mark ``artist`` as redrawn on every render (it is left out of the layers)."""
        artist.set_animated(True)
        self._dynamic.append(artist)
        return artist

    def forget(self, artists: Iterable[Artist]) -> None:
        """Remove dynamic artists from the figure (a view rebuilding its picture). The layers
        never hold them, so they stay valid."""
        for artist in artists:
            if artist in self._dynamic:
                self._dynamic.remove(artist)
            artist.remove()

    def invalidate(self, ax: Axes | None = None, changed: str = "all") -> None:
        """What ``ax`` (or, without it, the whole figure) shows has changed: the next render
        draws it again. ``changed="x limits"``: only its x limits, and its data artists are all
        dynamic: only its x axis is drawn (or taken from those kept). ``"y limits"``: the same
        for its y axis. ``"body"``: all of it but its axes (a legend, a static artist)."""
        if changed not in CHANGES:
            raise ValueError(f"changed must be one of {sorted(CHANGES)}; got {changed!r}")
        if ax is None:
            self._layers.clear()
            self._x_axes.clear()
            self._composite = None
            return
        if changed == "all":
            self._x_axes.pop(ax, None)
        self._stale.update((ax, part) for part in CHANGES[changed])

    def png(self) -> bytes:
        with RENDER_LOCK:
            renderer = self.canvas.get_renderer()
            self._update_background(renderer)
            np.asarray(renderer.buffer_rgba())[...] = self._background
            for artist in self._dynamic:
                if artist.get_visible() and artist.axes is not None:
                    artist.axes.draw_artist(artist)
            return encode_png(self.canvas.buffer_rgba())

    def _update_background(self, renderer: RendererAgg) -> None:
        """Draw the layers that are stale or missing (axes added), then lay every layer again
        over the boxes those covered before and cover now."""
        wanted = [(None, FIGURE)] + [(ax, part) for ax in self.figure.axes for part in PARTS]
        if self._composite is not None and not self._stale and self._layers.keys() == set(wanted):
            return
        layers, dirty = {}, [self._layers[key].box for key in self._layers.keys() - set(wanted)]  # axes removed
        for key in wanted:
            layer = self._layers.get(key)
            if layer is None or key in self._stale:
                new = self._x_axis_layer(renderer, key[0]) if key[1] == X_AXIS else self._draw_layer(renderer, *key)  # type: ignore[arg-type]  # an x axis key has its axes
                dirty.append(new.box if layer is None else union(layer.box, new.box))
                layer = new
            layers[key] = layer
        self._layers, self._stale = layers, set()
        shape = np.asarray(renderer.buffer_rgba()).shape
        composite, background = self._composite, self._background
        if composite is None or background is None:
            composite = self._composite = np.empty((*shape[:2], 3), dtype=np.float32)
            background = self._background = np.full(shape, 255, dtype=np.uint8)
            dirty = [(0, shape[0], 0, shape[1])]
        for box in filter(None, dirty):
            r0, r1, c0, c1 = box
            composite[r0:r1, c0:c1] = 255.0  # an empty Agg canvas is white
            for layer in layers.values():
                layer.over(composite, box)
            background[r0:r1, c0:c1, :3] = np.rint(composite[r0:r1, c0:c1])

    def _x_axis_layer(self, renderer: RendererAgg, ax: Axes) -> Layer:
        """``ax``'s x axis at its limits: the one kept for them, else drawn (and kept)."""
        kept = self._x_axes.setdefault(ax, {})
        limits = ax.get_xlim()
        layer = kept.pop(limits, None) or self._draw_layer(renderer, ax, X_AXIS)
        kept[limits] = layer  # the latest last
        if len(kept) > KEPT_X_AXES:
            del kept[next(iter(kept))]
        return layer

    def _draw_layer(self, renderer: RendererAgg, ax: Axes | None, part: str) -> Layer:
        renderer.clear()  # transparent
        if ax is None:  # the figure's patch and texts, its axes hidden
            shown = [a for a in self.figure.axes if a.get_visible()]
            for a in shown:
                a.set_visible(False)
            try:
                self.figure.draw(renderer)
            finally:
                for a in shown:
                    a.set_visible(True)
        elif part in (X_AXIS, Y_AXIS):
            if ax.get_visible() and ax.axison:
                (ax.xaxis if part == X_AXIS else ax.yaxis).draw(renderer)
        else:
            axes_shown = ax.xaxis.get_visible(), ax.yaxis.get_visible()
            ax.xaxis.set_visible(False)
            ax.yaxis.set_visible(False)
            try:
                ax.draw(renderer)
            finally:
                ax.xaxis.set_visible(axes_shown[0])
                ax.yaxis.set_visible(axes_shown[1])
        return Layer(np.asarray(renderer.buffer_rgba()))


class Layer:
    """What one drawing put on a transparent canvas: the box it covered (rows r0:r1, columns
    c0:c1), its colours premultiplied by their opacity, ready to be laid over what is below."""

    def __init__(self, rgba: np.ndarray) -> None:
        alpha = rgba[..., 3]
        rows, cols = np.flatnonzero(alpha.any(axis=1)), np.flatnonzero(alpha.any(axis=0))
        self.box = (rows[0], rows[-1] + 1, cols[0], cols[-1] + 1) if rows.size else None
        if self.box is not None:
            r0, r1, c0, c1 = self.box
            crop = rgba[r0:r1, c0:c1].astype(np.float32)
            opacity = crop[..., 3:] / 255.0
            self.color, self.transparency = crop[..., :3] * opacity, 1.0 - opacity

    def over(self, out: np.ndarray, box: tuple) -> None:
        """Lay this layer over ``out`` (RGB, float, the whole figure), in place, within ``box``."""
        if self.box is None:
            return
        r0, r1 = max(box[0], self.box[0]), min(box[1], self.box[1])
        c0, c1 = max(box[2], self.box[2]), min(box[3], self.box[3])
        if r0 >= r1 or c0 >= c1:
            return
        mine = np.s_[r0 - self.box[0] : r1 - self.box[0], c0 - self.box[2] : c1 - self.box[2]]
        below = out[r0:r1, c0:c1]
        below *= self.transparency[mine]
        below += self.color[mine]


def union(a: tuple | None, b: tuple | None) -> tuple | None:
    """The smallest box holding boxes ``a`` and ``b`` (either may be None: nothing)."""
    if a is None or b is None:
        return a or b
    return min(a[0], b[0]), max(a[1], b[1]), min(a[2], b[2]), max(a[3], b[3])


def encode_png(rgba: ArrayLike) -> bytes:
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
    return (
        PNG_SIGNATURE
        + _png_chunk(b"IHDR", header)
        + _png_chunk(b"IDAT", zlib.compress(rows.data, PNG_COMPRESS_LEVEL))
        + _png_chunk(b"IEND", b"")
    )


def _png_chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def static_png(fig: Figure) -> bytes:
    """One full render of a figure that is drawn once (not live)."""
    canvas = FigureCanvasAgg(fig)
    with RENDER_LOCK:
        canvas.draw()
        return encode_png(canvas.buffer_rgba())
