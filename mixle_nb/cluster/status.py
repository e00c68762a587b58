"""The status table: one row per rank, as text or HTML."""

from __future__ import annotations

import html
from dataclasses import dataclass


@dataclass(frozen=True)
class RankStatus:
    """One rank as :meth:`MixleCluster.status` sees it (``rss_bytes`` is None for remote hosts)."""

    engine_id: int
    rank: int
    pid: int
    host: str
    alive: bool
    in_group: bool
    rss_bytes: int | None
    last_call_s: float | None


class ClusterStatus(list):
    """A list of :class:`RankStatus` rows that renders as a table; ``job`` is a line about the
    scheduler's job the engines run in (Slurm), and ``dropped`` counts the stray messages the
    client dropped (by ``"<stream>: <reason>"``), each shown above it when there is one."""

    job = ""
    dropped: dict[str, int] = {}  # noqa: RUF012 (replaced, never changed in place)

    def _notes(self) -> list[str]:
        notes = [self.job] if self.job else []
        if self.dropped:
            counts = ", ".join(f"{key} {count}" for key, count in sorted(self.dropped.items()))
            notes.append(f"stray messages dropped: {counts}")
        return notes

    _COLUMNS = ("engine_id", "rank", "pid", "host", "alive", "in_group", "rss_MiB", "last_call_s")

    def _cells(self, row: RankStatus) -> list[str]:
        rss = "-" if row.rss_bytes is None else f"{row.rss_bytes / 2**20:.0f}"
        last = "-" if row.last_call_s is None else f"{row.last_call_s:.3f}"
        return [str(row.engine_id), str(row.rank), str(row.pid), row.host, str(row.alive), str(row.in_group), rss, last]

    def __str__(self) -> str:
        rows = [list(self._COLUMNS)] + [self._cells(r) for r in self]
        widths = [max(len(r[i]) for r in rows) for i in range(len(self._COLUMNS))]
        table = "\n".join("  ".join(c.rjust(w) for c, w in zip(r, widths)) for r in rows)
        return "\n".join([*self._notes(), table])

    def _repr_html_(self) -> str:
        head = "".join(f"<th>{c}</th>" for c in self._COLUMNS)
        body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in self._cells(r)) + "</tr>" for r in self)
        notes = "".join(f"<p>{html.escape(note)}</p>" for note in self._notes())
        return f"{notes}<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"
