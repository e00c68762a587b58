"""Which cells of the peer grid (``benchmarks/peer_grid.py``) a library skips, and why.

A library's measure (``"iteration"`` or ``"fit"``) in a cell is *trimmed*, with a kind and a
stated reason kept in the JSON, where

- ``unsupported``: the library has no such model (pomegranate's ``tied`` covariance);
- ``memory``: the data and one ``(K, N, D)`` temporary pass the ``--max-gb`` budget;
- ``cap``: one call of it took longer than the ``--max-call-s`` cap (it is stopped there);
- ``predicted``: the last two smaller N of the same column (D, K, covariance, threads), as an
  affine cost in N (a set-up and a per-point part), predict a call over ``PREDICTED_MARGIN``
  times the cap here (the margin: a noisy small-N time extrapolated tenfold; a call predicted
  between once and twice the cap is tried, and stopped at the cap);
- ``dominated``: it passed the cap at a cell no larger in N, D and K of the same covariance and
  threads (its cost grows with each);
- ``outpaced``: a peer whose time here is bound to be over ``OUTPACE`` times another peer's, so
  that it cannot be the fastest peer and the ratio does not need it: before the cell, by its
  time from the column's smaller N (or this cell at one thread, halved) against the other's
  (``Trims.outpaced``); in the cell, by its *floor*, its least time in any cell so far (its
  set-up: a Lightning trainer's start, say), against the other's time just measured
  (``peer_grid.outpaced``);
- ``no peer``: ours, where every peer's is trimmed (no ratio to draw);
- ``budget``: the run's ``--budget-min`` was spent before the cell's turn (the largest N last).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

MEASURES = ("iteration", "fit")
PILOT_STEPS = 2  # the fewest iterations a cell differences: the shortest long call is LOW + this
PREDICTED_MARGIN = 2.0  # a predicted call over this many caps is not tried
OUTPACE = 10.0  # a peer bound to be this many times another's time is not measured


def trim(kind: str, reason: str) -> dict[str, str]:
    """A trimmed measure's entry in the JSON."""
    return {"kind": kind, "reason": reason}


def affine(points: list[tuple[int, float]], n: int) -> float:
    """The value at ``n`` of the line through the last two ``(N, value)`` points (slope at least 0)."""
    (n1, t1), (n2, t2) = points[-2:]
    slope = max((t2 - t1) / (n2 - n1), 0.0)
    return t2 + slope * (n - n2)


@dataclass
class Trims:
    """The trim rule of one run: the caps, and what has been measured and trimmed so far."""

    max_call_s: float
    max_gb: float
    # (library, d, k, cov, threads) -> [(n, result)], the measured cells of a column, N ascending
    history: dict[tuple, list[tuple[int, dict[str, Any]]]] = field(default_factory=dict)
    # (library, measure, cov, threads) -> [(n, d, k)] where it passed the cap
    blocked: dict[tuple, list[tuple[int, int, int]]] = field(default_factory=dict)

    def reason(self, lib: str, measure: str, n: int, d: int, k: int, cov: str, threads: int) -> dict[str, str] | None:
        """Why ``lib`` skips ``measure`` in this cell (its entry), or ``None``."""
        if lib == "pomegranate" and cov == "tied":
            return trim("unsupported", "pomegranate has no tied covariance")
        gigabytes = n * d * 8 * (1 + k) / 1e9
        if gigabytes > self.max_gb:
            return trim(
                "memory", f"about {gigabytes:.0f} GB of data and a (K, N, D) temporary: over --max-gb {self.max_gb:g}"
            )
        for n0, d0, k0 in self.blocked.get((lib, measure, cov, threads), []):
            if n0 <= n and d0 <= d and k0 <= k:
                return trim(
                    "dominated", f"over the {self.max_call_s:g} s call cap already at N={n0:.0e}, D={d0}, K={k0}"
                )
        predicted = self.predicted_call_s(lib, measure, n, d, k, cov, threads)
        if predicted is not None and predicted > PREDICTED_MARGIN * self.max_call_s:
            measured = [m for m, _ in self.history[(lib, d, k, cov, threads)][-2:]]
            return trim(
                "predicted",
                f"a call predicted at {predicted:.3g} s (affine in N from N={measured[0]:.0e} and {measured[1]:.0e}): "
                f"over {PREDICTED_MARGIN:g}x the {self.max_call_s:g} s cap",
            )
        return None

    def outpaced(
        self, lib: str, peers: list[str], measure: str, n: int, d: int, k: int, cov: str, threads: int
    ) -> dict[str, str] | None:
        """Trim peer ``lib`` where its least time here is over ``OUTPACE`` times the most of one of
        ``peers`` (those measured here)."""
        key = f"{measure}_s"
        least = self.bound(lib, key, n, d, k, cov, threads, upper=False)
        if least is None:
            return None
        for other in peers:
            most = self.bound(other, key, n, d, k, cov, threads, upper=True)
            if most is not None and least > OUTPACE * most:
                return trim(
                    "outpaced",
                    f"{measure} bound to take {least:.3g} s or more, over {OUTPACE:g}x {other}'s {most:.3g} s",
                )
        return None

    def bound(self, lib: str, key: str, n: int, d: int, k: int, cov: str, threads: int, upper: bool) -> float | None:
        """``lib``'s ``key`` time here: affine in N from the column's last two N; else this cell at one
        thread (over ``threads`` for the least); else the last N's time, times N's growth for the most."""
        points = [(m, r[key]) for m, r in self.history.get((lib, d, k, cov, threads), []) if r.get(key, 0.0) > 0.0]
        if len(points) >= 2:
            return affine(points, n)
        one_thread = [r[key] for m, r in self.history.get((lib, d, k, cov, 1), []) if m == n and r.get(key, 0.0) > 0.0]
        if threads > 1 and one_thread:
            return one_thread[0] if upper else one_thread[0] / threads
        if points:
            return points[-1][1] * (n / points[-1][0] if upper else 1.0)
        return None

    def predicted_call_s(self, lib: str, measure: str, n: int, d: int, k: int, cov: str, threads: int) -> float | None:
        """The longest call of ``measure`` predicted here from the column's last two measured N."""
        key = "low_s" if measure == "iteration" else "fit_s"
        points = [(m, r) for m, r in self.history.get((lib, d, k, cov, threads), []) if key in r]
        if len(points) < 2:
            return None
        if measure == "fit":
            return affine([(m, r["fit_s"]) for m, r in points], n)
        low = affine([(m, r["low_s"]) for m, r in points], n)
        return low + PILOT_STEPS * affine([(m, max(r["iteration_s"], 0.0)) for m, r in points], n)

    def record(self, lib: str, n: int, d: int, k: int, cov: str, threads: int, result: dict[str, Any]) -> None:
        """Note a library's result in a cell: its times for predictions, its cap trims for the cells above."""
        if "low_s" in result or "fit_s" in result:
            self.history.setdefault((lib, d, k, cov, threads), []).append((n, result))
        for measure in MEASURES:
            if result.get(f"{measure}_trimmed", {}).get("kind") == "cap":
                self.blocked.setdefault((lib, measure, cov, threads), []).append((n, d, k))
