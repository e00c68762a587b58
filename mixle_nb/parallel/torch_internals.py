"""Every use of torch's private APIs, in one place, with the torch versions it was checked against.

torch offers no public way to do these three things, which the fail-together paths need:

- :func:`default_store`: the rendezvous store of the default group, where a rank that fails in
  FSDP2 leaves its message for its peers (the store a group was formed with is not kept by a
  public API, and a cluster's engines form their group outside the handles);
- :func:`collectives_started`: how many collectives this rank started in the default group,
  which tells a cluster whether a rank was left inside a collective the others finished;
- :func:`rebuild_ddp_buckets`: a DDP rank that failed before its backward still takes part in
  the bucket rebuild (a broadcast) DDP's second forward makes, so its peers do not wait in it;
- :func:`default_group_timeout`: the timeout the default group was formed with (the tests check
  that a handle's ``timeout=`` reaches it).

They were checked against the torch versions :data:`CHECKED_TORCH` admits (the ``torch`` line of
``pyproject.toml`` pins the same range). :func:`missing_private_apis` names any that a torch
version lacks; ``tests/test_torch_internals.py`` fails with that list, so a torch upgrade that
breaks one says which and where.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

CHECKED_TORCH = (2, 4), (2, 14)  # [lowest, first unchecked) (major, minor); pyproject: torch>=2.4,<2.14


def _c10d() -> Any:
    return dist.distributed_c10d


def default_store() -> dist.Store:
    """The store the default group was formed with (the rendezvous every rank shares)."""
    return _c10d()._get_default_store()


def collectives_started() -> int:
    """Collectives this rank started in the default group (equal on every rank when none was
    left inside one)."""
    return int(_c10d()._get_default_group()._get_sequence_number_for_group())


def rebuild_ddp_buckets(ddp: torch.nn.Module) -> None:
    """Take part in the bucket rebuild DDP's second forward makes (a no-op otherwise)."""
    ddp.reducer._rebuild_buckets()  # type: ignore[union-attr, operator]


def default_group_timeout() -> timedelta:
    """The collective timeout the default group's CPU backend was formed with."""
    backend = _c10d()._get_default_group()._get_backend(torch.device("cpu"))
    return backend.options._timeout


def missing_private_apis() -> list[str]:
    """The private names above that this torch lacks (empty: every one is there)."""
    c10d = _c10d()
    missing = [f"torch.distributed.distributed_c10d.{n}" for n in ("_get_default_store", "_get_default_group")]
    missing = [name for name in missing if not hasattr(c10d, name.rsplit(".", 1)[1])]
    group_methods = ("_get_sequence_number_for_group", "_get_backend")
    missing += [f"torch.distributed.ProcessGroup.{n}" for n in group_methods if not hasattr(dist.ProcessGroup, n)]
    reducer = getattr(torch._C._distributed_c10d, "Reducer", None)
    if reducer is None or not hasattr(reducer, "_rebuild_buckets"):
        missing.append("torch._C._distributed_c10d.Reducer._rebuild_buckets (DistributedDataParallel.reducer)")
    return missing


def torch_version() -> tuple[int, int]:
    """This torch's (major, minor)."""
    major, minor = torch.__version__.split("+")[0].split(".")[:2]
    return int(major), int(minor)
