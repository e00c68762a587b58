"""The token handle's training modes (mixle_nb/parallel/training_modes.py), each on its own, in
one process: what it wraps, when the ranks agree to stop, how a failed step fails and what it
exports. Training through them on two ranks is tests/test_streaming_handle.py's."""

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from torch import nn

from mixle_nb.parallel.group import join_group
from mixle_nb.parallel.training_modes import (
    MODES,
    STEP_STATUS,
    DataParallel,
    FullySharded,
    OneProcess,
    StepStatus,
)


def test_the_modes_are_named_as_the_handle_resolves_them():
    assert MODES == {"none": OneProcess, "ddp": DataParallel, "fsdp": FullySharded}


def test_one_process_trains_the_module_as_it_is():
    module = nn.Linear(3, 2)
    mode = OneProcess(module, torch.device("cpu"), join_group(None, init_process_group=False), exchange=None)
    assert mode.wrapped is module and mode.export() is module
    assert not mode.peer_failed and not mode.stop_in_exchange
    assert mode.agreed_stop(True, 7, polled=True, every=10) and not mode.agreed_stop(False, 10, True, 10)
    with pytest.raises(ZeroDivisionError, match="its own"):
        mode.fail(ZeroDivisionError("its own"), exchange_pending=True, operation="training step 1")


class _Summing:
    """A stand-in exchange of one rank whose peers' stop wishes are given."""

    def __init__(self, peers: float):
        self.peers, self.calls = peers, 0

    def sum(self, numbers):
        self.calls += 1
        return np.asarray(numbers, dtype=np.float64) + self.peers


def test_fsdp2_agrees_to_stop_in_one_small_sum_every_few_steps_only_while_a_stop_flag_is_set():
    exchange = _Summing(peers=1.0)
    mode = SimpleNamespace(exchange=exchange)
    assert not FullySharded.agreed_stop(mode, False, 10, polled=False, every=10)  # no flag: no exchange
    assert not FullySharded.agreed_stop(mode, True, 7, polled=True, every=10)  # not a polling step
    assert exchange.calls == 0
    assert FullySharded.agreed_stop(mode, False, 20, polled=True, every=10)  # a peer asked
    assert exchange.calls == 1


def test_ddp_reads_stop_and_failure_from_the_words_after_the_gradients():
    status = StepStatus(size=4, dtype=torch.float32, group=None, world=2)
    words = status.words(torch.device("cpu"), stop=1.0, failed=0.0)
    assert words.dtype == torch.float32 and words.tolist() == STEP_STATUS.pack(stop=1.0, failed=0.0).tolist()
    mode = SimpleNamespace(status=status)
    status.agreed_stop, status.agreed_failed = True, True
    assert DataParallel.agreed_stop(mode, False, 3, polled=False, every=10)
    assert DataParallel.peer_failed.fget(mode) and DataParallel.stop_in_exchange.fget(mode)
