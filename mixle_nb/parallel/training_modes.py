"""How the token handle trains one module on its group's ranks: one small strategy per mode.

- :class:`OneProcess` (``parallel='none'``): the module as it is, on one rank.
- :class:`DataParallel` (``'ddp'``): every rank a replica; the step's status (stop requested,
  this rank failed) rides in the gradient all-reduce itself, so a rank that raises before or
  inside a step still takes part in that exchange with zeros and "failed", and every rank then
  raises at once.
- :class:`FullySharded` (``'fsdp'``): FSDP2 shards each block, then the root. The peers of a
  failed rank wait inside FSDP's own all-gathers and reduce-scatters, which it cannot stand in
  for: it leaves its message in the group's store and shuts its connections down, so they raise
  at once too, and the group must be formed again
  (:func:`~mixle_nb.parallel.fail_together.fail_by_severing`).

Each answers the same four questions: how the module is wrapped, whether the ranks agreed to
stop after a step, how a failed step fails on every rank, and how the trained module is exported.
"""

from __future__ import annotations

import copy
from typing import Any, ClassVar, NoReturn

import torch
import torch.distributed as dist
from torch import nn

from .exchange import Header, RankExchange, StatusCheck
from .fail_together import fail_by_severing
from .group import GroupMembership
from .torch_internals import rebuild_ddp_buckets

STEP_STATUS = Header(stop=1, failed=1)  # after the gradients in a DDP step's one all-reduce


class OneProcess:
    """``parallel='none'``: one rank trains the module as it is; nothing crosses ranks.

    ``module`` is trained on ``device``; ``membership`` and ``exchange`` are the handle's
    (the modes that cross ranks use them); ``precision`` is ``"fp32"`` or ``"bf16"`` (the
    sharded mode's compute dtype; the others autocast in the training loop)."""

    name: ClassVar[str] = "none"

    def __init__(
        self,
        module: nn.Module,
        device: torch.device,
        membership: GroupMembership,
        exchange: RankExchange,
        *,
        precision: str = "fp32",
    ) -> None:
        self.module, self.device, self.precision = module, device, precision
        self.membership, self.exchange = membership, exchange
        self.wrapped: nn.Module = self.wrap(module)

    def wrap(self, module: nn.Module) -> nn.Module:
        """The module the forward runs through."""
        return module

    def request_stop(self, local: bool) -> None:
        """This rank wants to stop after the coming step."""

    @property
    def peer_failed(self) -> bool:
        """Whether the last step's exchange said another rank failed."""
        return False

    @property
    def stop_in_exchange(self) -> bool:
        """Whether the last step's exchange said every rank stops after it."""
        return False

    def agreed_stop(self, local: bool, step: int, polled: bool, every: int) -> bool:
        """Whether every rank stops after step ``step`` (``local``: this rank's wish; ``polled``:
        a stop flag is set on the handle, checked every ``every`` steps where that costs an
        exchange)."""
        return local

    def fail(self, error: BaseException | None, exchange_pending: bool, operation: str) -> NoReturn:
        """Raise on every rank at once (``error``: this rank's, ``None`` when a peer failed;
        ``exchange_pending``: the peers wait in this step's exchange)."""
        assert error is not None  # without an exchange, only this rank's own error fails a step
        raise error

    def export(self) -> nn.Module:
        """The plain trained module."""
        return self.module


class DataParallel(OneProcess):
    """``parallel='ddp'``: DistributedDataParallel replicas, whose one gradient all-reduce per
    step carries the stop and failed words (:func:`allreduce_with_status`)."""

    name = "ddp"

    def wrap(self, module: nn.Module) -> nn.Module:
        trainable = [p for p in module.parameters() if p.requires_grad]
        self.status = StepStatus(
            sum(p.numel() for p in trainable), trainable[0].dtype, self.membership.group, self.membership.world
        )
        # init_sync=False: replicas are identical by construction, so no broadcast.
        wrapped = nn.parallel.DistributedDataParallel(
            module,
            device_ids=[self.device.index] if self.device.type == "cuda" else None,
            process_group=self.membership.group,
            forward_sync_buffers=False,
            init_sync=False,
        )
        wrapped.register_comm_hook(self.status, allreduce_with_status)
        return wrapped

    def request_stop(self, local: bool) -> None:
        self.status.stop = float(local)

    @property
    def peer_failed(self) -> bool:
        return self.status.agreed_failed

    @property
    def stop_in_exchange(self) -> bool:
        return self.status.agreed_stop

    def agreed_stop(self, local: bool, step: int, polled: bool, every: int) -> bool:
        return self.status.agreed_stop  # rode in the step's gradient all-reduce

    def fail(self, error: BaseException | None, exchange_pending: bool, operation: str) -> NoReturn:
        """Meet the peers in the exchange they wait in, then in the message exchange."""
        if error is not None and exchange_pending:
            self._stand_in_for_exchange()
        elif error is not None:  # the peers have finished the call; nobody waits for this rank
            raise error
        self.exchange.settle(StatusCheck(operation), error)

    def _stand_in_for_exchange(self) -> None:
        """A failed rank's part in the DDP step exchange its peers are in: zero gradients and
        "failed". DDP's second forward re-buckets once with a broadcast; take part in it too."""
        rebuild_ddp_buckets(self.wrapped)  # no-op unless this is that forward's collective
        words = torch.cat(
            [
                torch.zeros(self.status.size, dtype=self.status.dtype, device=self.device),
                self.status.words(stop=self.status.stop, failed=1.0, device=self.device),
            ]
        )
        dist.all_reduce(words, group=self.membership.group)


class FullySharded(OneProcess):
    """``parallel='fsdp'``: FSDP2 (``fully_shard``) on each block, then the root, in the
    handle's group; ``precision='bf16'`` computes in bfloat16 and reduces in float32."""

    name = "fsdp"

    def wrap(self, module: nn.Module) -> nn.Module:
        """Shard each block, then the root; keep a meta-device twin to export full weights into."""
        from torch.distributed.device_mesh import DeviceMesh
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        blocks = getattr(module, "blocks", None)
        if blocks is None:
            raise TypeError(f"parallel='fsdp' shards module.blocks one by one; {type(module).__name__} has no .blocks")
        self.replica = copy.deepcopy(module).to("meta")
        policy = (
            MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
            if self.precision == "bf16"
            else MixedPrecisionPolicy()
        )
        # the handle's group, on the module's device type: fully_shard's default mesh is the
        # default group's, on the accelerator whenever one exists, even for a CPU module
        group = self.membership.group or dist.group.WORLD
        assert group is not None  # FSDP2 runs in a group (the mode was resolved against one)
        mesh = DeviceMesh.from_group(group, next(module.parameters()).device.type)
        for blk in blocks:
            fully_shard(blk, mesh=mesh, mp_policy=policy)
        fully_shard(module, mesh=mesh, mp_policy=policy)
        return module

    def agreed_stop(self, local: bool, step: int, polled: bool, every: int) -> bool:
        """One 1-element sum every ``every`` steps, only while a stop flag is set."""
        if not polled or step % every:
            return False
        return bool(self.exchange.sum([float(local)])[0] > 0)

    def fail(self, error: BaseException | None, exchange_pending: bool, operation: str) -> NoReturn:
        assert error is not None  # FSDP2 carries no status word: only this rank's own error
        fail_by_severing(error, self.membership.rank, self.membership.world, operation)

    def export(self) -> nn.Module:
        """The shards gathered into the replica (collective: a failure severs the group)."""
        from torch.distributed.tensor import DTensor

        try:
            full = {k: v.full_tensor() if isinstance(v, DTensor) else v for k, v in self.module.state_dict().items()}
            if next(self.replica.parameters()).is_meta:
                self.replica.to_empty(device=self.device)
            self.replica.load_state_dict(full)
        except Exception as error:  # noqa: BLE001 - FSDP2's gather of the weights is collective
            self.fail(error, True, "gathering the trained weights")
        return self.replica


MODES: dict[str, type[OneProcess]] = {mode.name: mode for mode in (OneProcess, DataParallel, FullySharded)}


class StepStatus:
    """What a DDP step's exchange carries besides the gradients: stop and failed words.

    ``size`` and ``dtype`` describe the gradient part of the exchange, which is what a failed
    rank sends as zeros to stand in for its gradients; ``group`` (``None``: the default group)
    and ``world`` are the group it runs in and its size."""

    def __init__(self, size: int, dtype: torch.dtype, group: Any, world: int):
        self.size, self.dtype = size, dtype
        self.group, self.world = group, world
        self.stop = 0.0
        self.agreed_stop = False
        self.agreed_failed = False
        self._pending: list = []

    def words(self, device: torch.device, **fields: float) -> torch.Tensor:
        """The :data:`STEP_STATUS` words after the gradients, in their dtype."""
        return torch.as_tensor(STEP_STATUS.pack(**fields), dtype=self.dtype, device=device)


def allreduce_with_status(status, bucket):
    # type: (StepStatus, dist.GradBucket) -> torch.futures.Future[torch.Tensor]
    """DDP's mean all-reduce of every bucket as ONE all-reduce, with the status words appended.

    Buckets before the last return futures completed by that one exchange, so a step makes
    exactly one collective of a size known in advance — which is what lets a rank that failed
    stand in for its part of it. The price is DDP's overlap of early buckets' all-reduce with
    the rest of backward; a model under 1 MB of gradients is one bucket anyway. Unannotated on
    purpose: DDP rejects a string annotation, so its types are a type comment (mypy reads it,
    DDP's signature check never sees it)."""
    status._pending.append((bucket.buffer(), torch.futures.Future()))
    if not bucket.is_last():
        return status._pending[-1][1]
    pending, status._pending = status._pending, []
    buffers = [buf for buf, _ in pending]
    packed = torch.cat(
        [b.reshape(-1).to(status.dtype) for b in buffers]
        + [status.words(stop=status.stop, failed=0.0, device=buffers[0].device)]
    )
    packed[: -STEP_STATUS.width].div_(status.world)

    def unpack(fut: torch.futures.Future[list[torch.Tensor]]) -> torch.Tensor:
        out = fut.value()[0]
        words = STEP_STATUS.read(out[-STEP_STATUS.width :].cpu().numpy())
        status.agreed_stop, status.agreed_failed = words.stop > 0, words.failed > 0
        lo = 0
        for buf, future in pending[:-1]:
            future.set_result(out[lo : lo + buf.numel()].to(buf.dtype))
            lo += buf.numel()
        return out[lo : lo + buffers[-1].numel()].to(buffers[-1].dtype)

    return dist.all_reduce(packed, group=status.group, async_op=True).get_future().then(unpack)
