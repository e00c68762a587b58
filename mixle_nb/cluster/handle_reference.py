"""``cluster.handle("h")``: a reference, in the notebook, to the handle bound to ``h`` on every
rank, for code that runs where the data live (``mixle_nb.mixture.GaussianMixture.fit`` and its
scoring methods take one)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any, NoReturn

ECHO_S = 0.25  # how often rank 0's output is copied to the notebook while a call runs


def _with_handle(name: str, fn: Callable, args: tuple) -> Any:
    """On a rank: ``fn(handle, *args)``; only rank 0 sends its answer back (the ranks agree)."""
    import torch.distributed as dist

    from .rank_side import lookup

    result = fn(lookup(name), *args)
    return result if not dist.is_initialized() or dist.get_rank() == 0 else None


class HandleReference:
    """The handle named ``name`` in the ranks' namespaces (where ``%%mixle`` or ``push`` put it).

    Holds the cluster, so it is not picklable: an estimator fitted through one keeps only
    what came back."""

    def __init__(self, cluster: Any, name: str):
        if not isinstance(name, str) or not name.isidentifier():
            raise ValueError(f"a handle reference needs the handle's variable name on the ranks; got {name!r}")
        self.cluster, self.name = cluster, name

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r} on {self.cluster.n} ranks)"

    def __reduce__(self) -> NoReturn:
        raise TypeError(f"{self!r} refers to a live cluster and cannot be pickled; pickle what it computed")

    def call_with_handle(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(handle, *args)`` on every rank at once (an SPMD call); rank 0's answer. Rank 0's
        printed output is copied to this process's stdout while the call runs."""
        call = self.cluster.run_async(_with_handle, self.name, fn, args)
        shown = 0
        while True:
            try:
                results = call.result(timeout=ECHO_S)
                break
            except TimeoutError:
                shown = _echo(call, shown)
        call.wait_for_output(1.0)
        _echo(call, shown)
        return results[0]


def _echo(call: Any, shown: int) -> int:
    text = call.stdout.get(call.ranks[0]) or ""
    if len(text) > shown:
        sys.stdout.write(text[shown:])
        sys.stdout.flush()
    return len(text)
