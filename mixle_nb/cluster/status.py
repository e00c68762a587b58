"""The status table: one row per rank, as text or HTML."""

from __future__ import annotations

import html
from dataclasses import dataclass


@dataclass(frozen=True)
class RankStatus:
    """One rank as :meth:`MixleCluster.status` sees it: a row of the status table.

    Parameters
    ----------
    engine_id : int
        The ipyparallel engine id behind the rank.
    rank : int
        The rank in the group.
    pid : int
        The engine's process id, on ``host``.
    host : str
        The host the engine runs on.
    alive : bool
        Whether the engine is alive.
    in_group : bool
        Whether it is a member of the running group.
    rss_bytes : int or None
        The engine's resident memory; ``None`` for a remote host or a dead rank.
    last_call_s : float or None
        How long the rank ran the last call, ``None`` before any.

    Examples
    --------
    >>> from mixle_nb.cluster import RankStatus
    >>> row = RankStatus(0, 0, 4242, "node1", True, True, 150 * 2**20, 0.012)
    >>> row.alive, row.host
    (True, 'node1')
    """

    engine_id: int
    rank: int
    pid: int
    host: str
    alive: bool
    in_group: bool
    rss_bytes: int | None
    last_call_s: float | None


class ClusterStatus(list):
    """A list of :class:`RankStatus` rows that renders as a table, as text or HTML.

    ``job`` is a line about the scheduler's job the engines run in (Slurm), and ``dropped`` counts
    the stray messages the client dropped (by ``"<stream>: <reason>"``), each shown above the
    table when there is one.

    Parameters
    ----------
    iterable : iterable of RankStatus, optional
        The rows, one per rank.

    See Also
    --------
    MixleCluster.status : What builds it.

    Examples
    --------
    >>> from mixle_nb.cluster import ClusterStatus, RankStatus
    >>> print(ClusterStatus([RankStatus(0, 0, 4242, "node1", True, True, 150 * 2**20, 0.012)]))
    engine_id  rank   pid   host  alive  in_group  rss_MiB  last_call_s
            0     0  4242  node1   True      True      150        0.012
    """

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
