"""StreamingTokenEncodedData: single-process behaviour, and 2 real gloo ranks on loopback."""

import mmap
import os
import time
import traceback
from datetime import timedelta

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from strictness import unavailable

from mixle_nb.neural import (
    CausalLM,
    StreamingTransformerLeaf,
    StreamingTransformerLeafEstimator,
    build_causal_lm,
    stream_sequence_source,
)
from mixle_nb.parallel import StreamingTokenEncodedData
from mixle_nb.parallel.local_launch import free_port, run_local
from mixle_nb.parallel.token_handle import SAME_TOKENS
from mixle_nb.parallel.torch_internals import default_group_timeout

torch.set_num_threads(1)

VOCAB, BLOCK, BATCH, LR, SEED = 11, 16, 2, 1e-2, 7
N_TOKENS = 800  # two shards of 400 tokens -> 24 windows of 16 targets -> 12 steps per epoch
TOKENS = np.random.default_rng(0).integers(0, VOCAB, N_TOKENS).astype(np.uint8)
MARKOV_VOCAB = 6


def tiny_model(vocab=VOCAB, block=BLOCK, dtype=torch.float32):
    model = build_causal_lm(vocab, d_model=32, n_layer=2, n_head=2, block=block, seed=0)
    return model.to(dtype)


def parity_model():
    """float64, so the parity checks compare the training, not fp32 rounding: Adam divides
    by sqrt(v) + 1e-8, which turns rounding noise in near-zero gradients into lr-sized steps."""
    return tiny_model(dtype=torch.float64)


def handle(tokens=TOKENS, **kw):
    """One process unless a group exists (the ranks of a parity test adopt theirs)."""
    kw.setdefault("init_process_group", False)
    return StreamingTokenEncodedData(
        tokens, block=kw.pop("block", BLOCK), batch_size=kw.pop("batch_size", BATCH), seed=SEED, **kw
    )


def markov_chain(n, seed):
    """Tokens from a fixed 6-state chain, and the chain's entropy rate in nats."""
    rng = np.random.default_rng(123)
    trans = rng.dirichlet(np.full(MARKOV_VOCAB, 0.3), MARKOV_VOCAB)
    evals, evecs = np.linalg.eig(trans.T)
    pi = np.real(evecs[:, np.argmin(abs(evals - 1))])
    pi /= pi.sum()
    entropy_rate = -float(np.sum(pi[:, None] * trans * np.log(trans)))
    cdf = trans.cumsum(1)
    u = np.random.default_rng(seed).random(n)
    out = np.empty(n, dtype=np.int64)
    out[0] = 0
    for i in range(1, n):
        out[i] = min(np.searchsorted(cdf[out[i - 1]], u[i]), MARKOV_VOCAB - 1)
    return out, entropy_rate


def every_position_loss(model, inputs, targets):
    """Mean next-token loss over every position, written out independently of the handle."""
    logits = model(torch.as_tensor(inputs), return_all_logits=True)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), torch.as_tensor(targets).reshape(-1))


def state(module):
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


# -- single process -----------------------------------------------------------------------


def test_validation_names_the_problem_before_any_work():
    with pytest.raises(ValueError, match="block=800 must be smaller"):
        handle(block=N_TOKENS)
    with pytest.raises(ValueError, match="batch_size must be a positive int"):
        handle(batch_size=0)
    with pytest.raises(ValueError, match="batch_size=900 exceeds"):
        handle(batch_size=900)
    with pytest.raises(TypeError, match="must hold integers"):
        handle(TOKENS.astype(np.float32))
    with pytest.raises(ValueError, match="optimizer must be one of"):
        StreamingTransformerLeafEstimator(tiny_model(), optimizer="adam")
    with pytest.raises(ValueError, match="parallel must be one of"):
        handle(parallel="zero3")
    with pytest.raises(ValueError, match="precision must be one of"):
        handle(precision="fp16")
    est = StreamingTransformerLeafEstimator(tiny_model(vocab=5))
    with pytest.raises(ValueError, match="token id 10 is outside the model's vocabulary"):
        handle().pysp_seq_estimate(est, None)
    with pytest.raises(ValueError, match="exceeds the model's block"):
        handle(block=20).pysp_seq_estimate(StreamingTransformerLeafEstimator(tiny_model()), None)
    with pytest.raises(RuntimeError, match="needs a torch.distributed process group"):
        handle(parallel="ddp").pysp_seq_estimate(StreamingTransformerLeafEstimator(tiny_model()), None)


def test_single_process_matches_manual_adamw_and_reruns_bit_identically():
    runs = []
    for _ in range(2):
        est = StreamingTransformerLeafEstimator(tiny_model(), lr=LR)
        leaf = handle(max_steps=5).pysp_seq_estimate(est, None)
        assert isinstance(leaf, StreamingTransformerLeaf) and leaf.module is est.module
        runs.append(state(leaf.module))
    for k in runs[0]:
        assert torch.equal(runs[0][k], runs[1][k])  # bit-identical rerun

    ref = tiny_model()
    opt = torch.optim.AdamW(ref.parameters(), lr=LR)
    for _, (inputs, targets) in zip(range(5), stream_sequence_source(TOKENS, BLOCK, BATCH, seed=SEED, drop_last=True)):
        opt.zero_grad()
        every_position_loss(ref, inputs, targets).backward()
        opt.step()
    for k, v in state(ref).items():
        torch.testing.assert_close(runs[0][k], v, atol=1e-6, rtol=0)


def test_initialize_returns_the_untrained_module_and_stop_ends_training_at_once():
    est = StreamingTransformerLeafEstimator(tiny_model())
    before = state(est.module)
    h = handle(stop=lambda: True)
    leaf = h.pysp_seq_initialize(est, np.random.RandomState(0), 1.0)
    assert all(torch.equal(before[k], v) for k, v in state(leaf.module).items())
    h.pysp_seq_estimate(est, None)
    assert h._training.step == 1  # polled before step 1, honoured after it


def test_log_density_sum_matches_the_leaf_on_every_window():
    est = StreamingTransformerLeafEstimator(tiny_model())
    h = handle()
    leaf = h.pysp_seq_initialize(est, None, 1.0)
    count, total = h.pysp_seq_log_density_sum(leaf)
    ctx = np.stack([TOKENS[i : i + BLOCK] for i in range(N_TOKENS - BLOCK)])
    assert count == N_TOKENS - BLOCK
    assert total == pytest.approx(leaf.seq_log_density((ctx, TOKENS[BLOCK:])).sum(), rel=1e-9)


# -- two gloo ranks -----------------------------------------------------------------------


def _train(est, **kw):
    log = []
    h = handle(progress=log.append, **kw)
    leaf = h.pysp_seq_estimate(est, None)
    return h, leaf, log


def _rank_runs(rank):
    out = {}
    est = StreamingTransformerLeafEstimator(parity_model(), lr=LR)
    h, leaf, log1 = _train(est, progress_every=5)
    out["ddp_1"], out["log_1"] = state(leaf.module), log1
    h.progress = (log2 := []).append
    out["ddp_2"], out["log_2"] = state(h.pysp_seq_estimate(est, None).module), log2
    h.close()
    out["group_alive_after_close"] = dist.is_initialized()

    _, leaf, _ = _train(StreamingTransformerLeafEstimator(parity_model(), lr=LR), activation_checkpointing=True)
    out["ckpt"] = state(leaf.module)

    _, leaf, _ = _train(StreamingTransformerLeafEstimator(parity_model(), lr=LR, optimizer="sgd"))
    out["ddp_sgd"] = state(leaf.module)

    polls = iter(range(1000))
    stop = (lambda: next(polls) >= 2) if rank == 1 else (lambda: False)  # rank 1 only, 3rd poll
    h, leaf, _ = _train(StreamingTransformerLeafEstimator(parity_model(), lr=LR), stop=stop)
    out["ddp_stop_step"], out["ddp_stop"] = h._training.step, state(leaf.module)

    _, leaf, log = _train(StreamingTransformerLeafEstimator(tiny_model(), lr=LR), precision="bf16")
    out["bf16"], out["bf16_log"] = state(leaf.module), log

    for bad in ({"parallel": "none"}, {"block": 500}):
        try:
            _train(StreamingTransformerLeafEstimator(tiny_model(), lr=LR), **bad)
        except ValueError as err:
            out[f"error_{next(iter(bad))}"] = str(err)

    tokens, entropy_rate = markov_chain(24_000, seed=1)
    est = StreamingTransformerLeafEstimator(tiny_model(MARKOV_VOCAB, 8), lr=1e-2)
    _, leaf, _ = _train(est, block=8, batch_size=8, tokens=tokens)
    held_out = handle(markov_chain(4_000, seed=2)[0], block=8, batch_size=64)
    count, total = held_out.pysp_seq_log_density_sum(leaf)
    out["markov"] = (-total / count, entropy_rate)

    try:
        _, leaf, _ = _train(StreamingTransformerLeafEstimator(parity_model(), lr=LR), parallel="fsdp")
        out["fsdp"] = state(leaf.module)
        _, leaf, _ = _train(StreamingTransformerLeafEstimator(parity_model(), lr=LR, optimizer="sgd"), parallel="fsdp")
        out["fsdp_sgd"] = state(leaf.module)
        polls = iter(range(1000))
        h, leaf, _ = _train(
            StreamingTransformerLeafEstimator(tiny_model(), lr=LR), parallel="fsdp", stop=stop, progress_every=2
        )
        out["fsdp_stop_step"] = h._training.step
    except Exception:  # recorded so the test can skip with the real reason
        out["fsdp_error"] = traceback.format_exc()
    return out


def _rank_main(rank, world):
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    try:
        return _rank_runs(rank)
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def ranks(every_run):
    return run_part(every_run, "ranks")


def _assert_replicas_identical(results, key):
    for k, v in results[0][key].items():
        assert (v - results[1][key][k]).abs().max().item() == 0, k


def _assert_close_states(a, b, atol):
    for k in a:
        torch.testing.assert_close(a[k], b[k], atol=atol, rtol=0, msg=k)


def _union_reference(n_steps, checkpoints, optimizer=torch.optim.AdamW):
    """One process, one ``optimizer``, each step on the union of both ranks' micro-batches."""
    shards = [TOKENS[: N_TOKENS // 2], TOKENS[N_TOKENS // 2 :]]
    sources = [stream_sequence_source(s, BLOCK, BATCH, epochs=2, seed=SEED, drop_last=True) for s in shards]
    model = parity_model()
    opt = optimizer(model.parameters(), lr=LR)
    states, rank_losses = {}, [[], []]
    for step, batches in enumerate(zip(*sources), start=1):
        inputs = np.concatenate([x for x, _ in batches])
        targets = np.concatenate([y for _, y in batches])
        for r in range(2):
            rows = slice(r * BATCH, (r + 1) * BATCH)
            rank_losses[r].append(every_position_loss(model, inputs[rows], targets[rows]).item())
        opt.zero_grad()
        every_position_loss(model, inputs, targets).backward()
        opt.step()
        if step in checkpoints:
            states[step] = state(model)
        if step == n_steps:
            break
    return states, rank_losses


@pytest.mark.ranks
def test_ddp_replicas_identical_and_match_union_reference_across_two_calls(ranks):
    _assert_replicas_identical(ranks, "ddp_1")
    _assert_replicas_identical(ranks, "ddp_2")
    ref, _ = _union_reference(24, {12, 24})
    _assert_close_states(ranks[0]["ddp_1"], ref[12], atol=1e-5)
    _assert_close_states(ranks[0]["ddp_2"], ref[24], atol=1e-5)


@pytest.mark.ranks
def test_plain_sgd_under_ddp_and_fsdp2_is_the_union_reference_to_rounding(ranks):
    """AdamW is invariant to a constant gradient factor, so its parity cannot see a wrong
    world-size divisor; plain SGD in float64 can (a sum instead of a mean doubles every step)."""
    if "fsdp_error" in ranks[0]:
        unavailable(f"FSDP2 fully_shard failed on CPU/gloo in torch {torch.__version__}:\n{ranks[0]['fsdp_error']}")
    ref, _ = _union_reference(12, {12}, optimizer=torch.optim.SGD)
    for key in ("ddp_sgd", "fsdp_sgd"):
        _assert_replicas_identical(ranks, key)
        _assert_close_states(ranks[0][key], ref[12], atol=1e-12)


@pytest.mark.ranks
def test_second_call_keeps_optimizer_state(ranks):
    # A fresh AdamW for the second call (the reference handle's behaviour) lands elsewhere.
    ref, _ = _union_reference(12, {12})
    model = parity_model()
    model.load_state_dict(ref[12])
    opt = torch.optim.AdamW(model.parameters(), lr=LR)
    shards = [TOKENS[: N_TOKENS // 2], TOKENS[N_TOKENS // 2 :]]
    batches = [list(stream_sequence_source(s, BLOCK, BATCH, epochs=2, seed=SEED, drop_last=True))[12:] for s in shards]
    for (x0, y0), (x1, y1) in zip(*batches):
        opt.zero_grad()
        every_position_loss(model, np.concatenate([x0, x1]), np.concatenate([y0, y1])).backward()
        opt.step()
    gap = max((v - ranks[0]["ddp_2"][k]).abs().max().item() for k, v in state(model).items())
    assert gap > 1e-3


@pytest.mark.ranks
def test_progress_reports_local_loss_every_k_steps_and_at_the_end(ranks):
    _, rank_losses = _union_reference(24, set())
    for r in range(2):
        log = ranks[r]["log_1"] + ranks[r]["log_2"]
        assert [e["step"] for e in log] == [5, 10, 12, 15, 20, 24]
        assert [e["targets"] for e in log] == [s * BATCH * BLOCK for s in (5, 10, 12, 15, 20, 24)]
        assert all(e["rank"] == r and e["targets_per_s"] > 0 for e in log)
        bounds = [0, 5, 10, 12, 15, 20, 24]
        expected = [np.mean(rank_losses[r][a:b]) for a, b in zip(bounds, bounds[1:])]
        np.testing.assert_allclose([e["loss"] for e in log], expected, atol=1e-5)


@pytest.mark.ranks
def test_activation_checkpointing_trains_the_same_model(ranks):
    _assert_close_states(ranks[0]["ckpt"], ranks[0]["ddp_1"], atol=1e-5)
    _assert_replicas_identical(ranks, "ckpt")


@pytest.mark.ranks
def test_stop_seen_by_one_rank_stops_both_after_the_same_step(ranks):
    assert ranks[0]["ddp_stop_step"] == ranks[1]["ddp_stop_step"] == 3
    _assert_replicas_identical(ranks, "ddp_stop")
    ref, _ = _union_reference(3, {3})
    _assert_close_states(ranks[0]["ddp_stop"], ref[3], atol=1e-5)


@pytest.mark.ranks
def test_bf16_autocast_on_cpu_keeps_replicas_identical_and_learns(ranks):
    _assert_replicas_identical(ranks, "bf16")
    fp32 = {k: v.float() for k, v in ranks[0]["ddp_1"].items()}
    _assert_close_states(ranks[0]["bf16"], fp32, atol=5e-2)
    losses = [e["loss"] for e in ranks[0]["bf16_log"]]
    assert losses[-1] < losses[0]


@pytest.mark.ranks
def test_mode_and_shard_errors_on_two_ranks(ranks):
    for r in range(2):
        assert "would train 2 different models" in ranks[r]["error_parallel"]
        assert "smallest rank shard (400 of 800 tokens over 2 ranks)" in ranks[r]["error_block"]
        assert ranks[r]["group_alive_after_close"]  # close() leaves a group it did not create


@pytest.mark.ranks
def test_markov_stream_loss_reaches_entropy_rate(ranks):
    nll, entropy_rate = ranks[0]["markov"]
    assert ranks[1]["markov"] == ranks[0]["markov"]
    assert entropy_rate < nll < 1.10 * entropy_rate


@pytest.mark.ranks
def test_fsdp2_on_cpu_matches_ddp(ranks):
    if "fsdp_error" in ranks[0]:
        unavailable(f"FSDP2 fully_shard failed on CPU/gloo in torch {torch.__version__}:\n{ranks[0]['fsdp_error']}")
    _assert_replicas_identical(ranks, "fsdp")
    _assert_close_states(ranks[0]["fsdp"], ranks[0]["ddp_1"], atol=1e-5)
    # FSDP2 checks stop every progress_every=2 steps: rank 1 asks before step 3, all stop at 4.
    assert ranks[0]["fsdp_stop_step"] == ranks[1]["fsdp_stop_step"] == 4


# -- fail together, mixle's leaf, token files (2 gloo ranks) -------------------------------

FAULT_TIME = []  # wall-clock time of each fault injected on this rank


def inject(error):
    FAULT_TIME.append(time.time())
    return error


class FailingLM(CausalLM):
    """A CausalLM whose forward raises at call ``fail_at`` (a stand-in for running out of memory)."""

    fail_at = None

    def forward(self, contexts, *, return_all_logits=False):
        self.calls = getattr(self, "calls", 0) + 1
        if self.calls == self.fail_at:
            raise inject(RuntimeError(f"forward call {self.calls} ran out of memory"))
        return super().forward(contexts, return_all_logits=return_all_logits)


def failing_model(fail_at):
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = FailingLM(VOCAB, 32, 2, 2, BLOCK)
    model.fail_at = fail_at
    return model


class UnscorableLeaf:
    def seq_log_density(self, enc):
        raise inject(ValueError("this rank's leaf cannot score"))


def _outcome(run):
    """``(error type, message, failed rank named, wall-clock time raised)`` of ``run()``, or
    ``None`` if it passed."""
    try:
        run()
    except Exception as err:  # noqa: BLE001 - the test inspects it
        return type(err).__name__, str(err), getattr(err, "rank", None), time.time()
    return None


def _raise_on_second_poll():
    """Raises before step 2, whose forward is where DDP re-buckets (a broadcast) once."""
    polls = iter(range(1000))

    def stop():
        if next(polls) == 1:
            raise inject(RuntimeError("stop flag source is unreachable"))
        return False

    return stop


def _raise_at_step_2(report):
    if report["step"] == 2:
        raise inject(RuntimeError("progress sink is full"))


def _fault_runs(rank):
    FAULT_TIME.clear()
    out, bad = {}, rank == 1
    est = lambda: StreamingTransformerLeafEstimator(tiny_model(), lr=LR)  # noqa: E731
    out["construct"] = _outcome(lambda: handle(inject(TOKENS.astype(np.float32)) if bad else TOKENS))
    out["disagree"] = _outcome(lambda: handle(block=BLOCK + 1 if bad else BLOCK))
    out["stop"] = _outcome(
        lambda: handle(max_steps=6, stop=_raise_on_second_poll() if bad else None).pysp_seq_estimate(est(), None)
    )
    for call in (2, 4):  # call 2 is DDP's re-bucketing forward (a broadcast before the step)
        h = handle(max_steps=6)
        out[f"forward_{call}"] = _outcome(
            lambda: h.pysp_seq_estimate(
                StreamingTransformerLeafEstimator(failing_model(call if bad else None), lr=LR), None
            )
        )
    retry = StreamingTransformerLeafEstimator(failing_model(None), lr=LR)
    out["retry"] = state(h.pysp_seq_estimate(retry, None).module)  # same handle, after a failure
    out["progress"] = _outcome(
        lambda: handle(max_steps=5, progress_every=1, progress=_raise_at_step_2 if bad else None).pysp_seq_estimate(
            est(), None
        )
    )
    h = handle()
    out["log_density"] = _outcome(
        lambda: h.pysp_seq_log_density_sum(UnscorableLeaf() if bad else h.pysp_seq_initialize(est(), None, 1.0))
    )
    out["fault_times"] = list(FAULT_TIME)
    return out


def _mixle_runs():
    from mixle.inference import seq_estimate as mixle_seq_estimate
    from mixle.models.streaming_transformer_leaf import StreamingTransformerEstimator
    from mixle.models.transformer import build_causal_lm as mixle_causal_lm

    torch.manual_seed(0)
    est = StreamingTransformerEstimator(mixle_causal_lm(VOCAB, 32, 2, 2, BLOCK).double(), lr=LR)
    h = handle()
    first = state(mixle_seq_estimate(h, est, None).module)  # mixle's dispatch drives our handle
    second = state(h.pysp_seq_estimate(est, None).module)
    return {"mixle_1": first, "mixle_2": second}


def file_backed(array):
    """Whether ``array`` is a view of a memory map (not a copy in this process's memory)."""
    base = array
    while base is not None and not isinstance(base, mmap.mmap):
        base = getattr(base, "base", None)
    return base is not None


def _file_runs(token_dir):
    out = {}
    for name, path, dtype in (("npy", "tokens.npy", None), ("bin", "tokens.bin", "uint32")):
        h = StreamingTokenEncodedData.from_file(
            os.path.join(token_dir, path), dtype=dtype, block=BLOCK, batch_size=BATCH, seed=SEED
        )
        out[f"{name}_mapped"] = file_backed(h.tokens) and len(h.tokens) == N_TOKENS // 2
        out[f"file_{name}"] = state(
            h.pysp_seq_estimate(StreamingTransformerLeafEstimator(parity_model(), lr=LR), None).module
        )
    return out


SUBGROUP_STEPS = 6


def _subgroup_runs(rank, root):
    """Rank 1 trains alone in a one-rank subgroup under DDP and FSDP2, checkpointing
    (asynchronously) into ``root``, while rank 0 waits at a barrier of the default group."""
    out, alone = {}, dist.new_group([1])
    if rank == 1:
        for parallel in ("ddp", "fsdp"):
            try:
                h = handle(
                    group=alone,
                    parallel=parallel,
                    max_steps=SUBGROUP_STEPS,
                    checkpoint=os.path.join(root, parallel),
                    checkpoint_every=SUBGROUP_STEPS // 2,
                )
                est = StreamingTransformerLeafEstimator(parity_model(), lr=LR, optimizer="sgd")
                out[f"subgroup_{parallel}"] = (h.rank, h.world, state(h.pysp_seq_estimate(est, None).module))
                again = handle(group=alone, parallel=parallel, checkpoint=os.path.join(root, parallel))
                out[f"subgroup_{parallel}_resumes_at"] = again.steps_done
            except Exception:  # recorded so the test shows the rank's traceback
                out[f"subgroup_{parallel}_error"] = traceback.format_exc()
    dist.barrier()
    return out


def _extras_main(rank, world, token_dir):
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    try:
        out = _fault_runs(rank)
        out.update(_subgroup_runs(rank, token_dir))
        out.update(_file_runs(token_dir))
        try:
            out.update(_mixle_runs())
        except ImportError as err:
            out["mixle_error"] = str(err)
        return out
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def extras(every_run):
    return run_part(every_run, "extras")


FAULTS = ["construct", "stop", "forward_2", "forward_4", "progress", "log_density"]


@pytest.mark.parametrize(
    "fault, message",
    [
        ("construct", "token_ids must hold integers"),
        ("stop", "stop flag source is unreachable"),
        ("forward_2", "forward call 2 ran out of memory"),
        ("forward_4", "forward call 4 ran out of memory"),
        ("progress", "progress sink is full"),
        ("log_density", "this rank's leaf cannot score"),
    ],
)
@pytest.mark.ranks
def test_a_fault_on_one_rank_raises_on_every_rank_promptly(extras, fault, message):
    own, peer = extras[1][fault], extras[0][fault]
    assert own is not None and message in own[1]  # the failed rank raises its own error
    assert peer is not None and peer[0] == "PeerRankError" and peer[2] == 1 and message in peer[1]
    injected = extras[1]["fault_times"][FAULTS.index(fault)]
    # The group timeout is 60 s; the bound leaves room for a loaded 2-core machine.
    assert max(own[3], peer[3]) - injected < 5


@pytest.mark.ranks
def test_ranks_that_disagree_on_an_argument_are_named_on_every_rank(extras):
    """Rank 1 passes another block: it is told how its arguments differ from rank 0's and what
    to do; rank 0 raises PeerRankError naming rank 1 (before, both only said "ranks disagree")."""
    own, peer = extras[1]["disagree"], extras[0]["disagree"]
    assert own[0] == "ValueError" and "differs from rank 0's" in own[1]
    assert f"block={BLOCK + 1}" in own[1] and f"block={BLOCK}" in own[1] and SAME_TOKENS in own[1]
    assert peer[0] == "PeerRankError" and peer[2] == 1 and SAME_TOKENS in peer[1]


# -- FSDP2 fails together too: 2 gloo ranks, a group per fault (a failed FSDP2 step leaves the
# group unusable: its peers are woken by the failed rank shutting its connections down)

FSDP_FAULTS = ["forward_3", "progress", "last_step"]


def _fsdp_fault_runs(rank, world, store_dir):
    from mixle_nb.parallel.group import leave_default_group
    from mixle_nb.parallel.severing import group_severed, init_default_group

    def fsdp_handle(**kw):
        return handle(parallel="fsdp", **kw)

    FAULT_TIME.clear()
    bad = rank == 1
    est = lambda: StreamingTransformerLeafEstimator(tiny_model(), lr=LR)  # noqa: E731
    cases = {  # each as FAULTS are run above; "last_step" fails after the last exchange of training
        "forward_3": lambda: fsdp_handle(max_steps=6).pysp_seq_estimate(
            StreamingTransformerLeafEstimator(failing_model(3 if bad else None), lr=LR), None
        ),
        "progress": lambda: fsdp_handle(
            max_steps=5, progress_every=1, progress=_raise_at_step_2 if bad else None
        ).pysp_seq_estimate(est(), None),
        "last_step": lambda: fsdp_handle(
            max_steps=2, progress_every=1, progress=_raise_at_step_2 if bad else None
        ).pysp_seq_estimate(est(), None),
        "after": lambda: state(fsdp_handle(max_steps=3).pysp_seq_estimate(est(), None).module),
    }
    out = {}
    for name, run in cases.items():
        init_default_group(
            "gloo",
            store=dist.FileStore(os.path.join(store_dir, name), 2),
            rank=rank,
            world_size=2,
            timeout=timedelta(seconds=60),
        )
        try:
            out[name] = run() if name == "after" else _outcome(run)
            out[f"{name}_severed"] = group_severed()
        except Exception:  # noqa: BLE001 - recorded so the test fails with the real reason
            out["fsdp_error"] = traceback.format_exc()
        finally:
            leave_default_group()
    out["fault_times"] = list(FAULT_TIME)
    return out


def _every_run(rank, world, token_dir, store_dir, ports):
    """The file's three 2-rank runs in one start of the 2 processes (each start, torch's import
    included, costs seconds): the training runs and the extras each in a group formed from the
    launcher's variables, on a port of its own, then the FSDP2 faults in their file-store groups;
    {run: its results, or ``run + "_error"``: the traceback of what it raised}."""
    out = {}
    runs = [
        ("ranks", lambda: _rank_main(rank, world)),
        ("extras", lambda: _extras_main(rank, world, token_dir)),
        ("fsdp_faults", lambda: _fsdp_fault_runs(rank, world, store_dir)),
    ]
    for (name, run), port in zip(runs, ports):
        os.environ["MASTER_PORT"] = str(port)
        try:
            out[name] = run()
        except Exception:  # noqa: BLE001 - its fixture fails with the rank's traceback
            out[f"{name}_error"] = traceback.format_exc()
    return out


@pytest.fixture(scope="module")
def every_run(tmp_path_factory):
    token_dir = tmp_path_factory.mktemp("tokens")
    np.save(token_dir / "tokens.npy", TOKENS.astype(np.uint16))
    TOKENS.astype(np.uint32).tofile(token_dir / "tokens.bin")
    stores = str(tmp_path_factory.mktemp("stores"))
    ports = [free_port() for _ in range(3)]
    return run_local(_every_run, 2, timeout=600, token_dir=str(token_dir), store_dir=stores, ports=ports)


def run_part(every_run, name):
    """One run's per-rank results from ``every_run``; failing with each rank's traceback if it raised."""
    errors = [f"rank {rank}:\n{out[name + '_error']}" for rank, out in enumerate(every_run) if name + "_error" in out]
    if errors:
        pytest.fail(f"the {name} run raised:\n" + "\n".join(errors))
    return [out[name] for out in every_run]


@pytest.fixture(scope="module")
def fsdp_faults(every_run):
    return run_part(every_run, "fsdp_faults")


@pytest.mark.parametrize(
    "fault, message",
    [
        ("forward_3", "forward call 3 ran out of memory"),
        ("progress", "progress sink is full"),
        ("last_step", "progress sink is full"),
    ],
)
@pytest.mark.ranks
def test_an_fsdp2_fault_on_one_rank_raises_on_every_rank_promptly(fsdp_faults, fault, message):
    assert "fsdp_error" not in fsdp_faults[0] and "fsdp_error" not in fsdp_faults[1], fsdp_faults
    own, peer = fsdp_faults[1][fault], fsdp_faults[0][fault]
    assert own is not None and own[0] == "RuntimeError" and message in own[1]
    assert peer is not None and peer[0] == "PeerRankError" and peer[2] == 1 and message in peer[1]
    injected = fsdp_faults[1]["fault_times"][FSDP_FAULTS.index(fault)]
    assert max(own[3], peer[3]) - injected < 5  # the group timeout is 60 s
    assert fsdp_faults[1][f"{fault}_severed"]  # the failed rank marked its group to be formed again


@pytest.mark.ranks
def test_fsdp2_trains_in_a_new_group_after_its_faults(fsdp_faults):
    assert not fsdp_faults[0]["after_severed"] and not fsdp_faults[1]["after_severed"]
    for k, v in fsdp_faults[0]["after"].items():
        assert torch.equal(v, fsdp_faults[1]["after"][k]), k


@pytest.mark.ranks
def test_training_resumes_on_the_same_handle_after_a_failed_step(extras):
    for k, v in extras[0]["retry"].items():
        assert torch.equal(v, extras[1]["retry"][k]), k


@pytest.mark.ranks
def test_from_file_trains_exactly_as_the_in_memory_array(extras, ranks):
    for r in range(2):
        assert extras[r]["npy_mapped"] and extras[r]["bin_mapped"]  # each rank maps only its part
        for name in ("file_npy", "file_bin"):
            for k, v in ranks[r]["ddp_1"].items():
                assert torch.equal(extras[r][name][k], v), (name, k)


def test_from_file_rejects_a_missing_or_needless_dtype(tmp_path):
    np.save(tmp_path / "t.npy", TOKENS.astype(np.uint16))
    TOKENS.astype(np.uint16).tofile(tmp_path / "t.bin")
    with pytest.raises(ValueError, match="say their dtype"):
        StreamingTokenEncodedData.from_file(tmp_path / "t.bin", block=BLOCK, batch_size=BATCH, init_process_group=False)
    with pytest.raises(ValueError, match="header fixes the dtype"):
        StreamingTokenEncodedData.from_file(
            tmp_path / "t.npy", dtype="uint16", block=BLOCK, batch_size=BATCH, init_process_group=False
        )


@pytest.mark.ranks
def test_mixle_streaming_transformer_trains_through_our_handle(extras):
    if "mixle_error" in extras[0]:
        unavailable(f"mixle is not installed: {extras[0]['mixle_error']}")
    from mixle.models.transformer import build_causal_lm as mixle_causal_lm

    for key in ("mixle_1", "mixle_2"):
        for k, v in extras[0][key].items():
            assert torch.equal(v, extras[1][key][k]), (key, k)
    torch.manual_seed(0)
    model = mixle_causal_lm(VOCAB, 32, 2, 2, BLOCK).double()
    opt = torch.optim.AdamW(model.parameters(), lr=LR)
    shards = [TOKENS[: N_TOKENS // 2], TOKENS[N_TOKENS // 2 :]]
    sources = [stream_sequence_source(s, BLOCK, BATCH, epochs=2, seed=SEED, drop_last=True) for s in shards]
    for step, batches in enumerate(zip(*sources), start=1):
        opt.zero_grad()
        every_position_loss(
            model, np.concatenate([x for x, _ in batches]), np.concatenate([y for _, y in batches])
        ).backward()
        opt.step()
        if step in (12, 24):
            _assert_close_states(extras[0][f"mixle_{step // 12}"], state(model), atol=1e-5)


@pytest.mark.ranks
def test_a_handle_on_a_one_rank_subgroup_trains_in_that_group_only(extras):
    """Rank 1 alone in its group: DDP's exchange (divided by the group's size, 1), FSDP2's mesh
    and the checkpoints' saves are that group's, so plain SGD in float64 is one process's run to
    rounding; the default group's size (2) would halve every step, its collectives wait for rank 0."""
    out = extras[1]
    assert "subgroup_ddp_error" not in out, out["subgroup_ddp_error"]
    if "subgroup_fsdp_error" in out:
        unavailable(
            f"FSDP2 on a subgroup failed on CPU/gloo in torch {torch.__version__}:\n{out['subgroup_fsdp_error']}"
        )
    est = StreamingTransformerLeafEstimator(parity_model(), lr=LR, optimizer="sgd")
    reference = state(handle(max_steps=SUBGROUP_STEPS).pysp_seq_estimate(est, None).module)
    for parallel in ("ddp", "fsdp"):
        rank, world, trained = out[f"subgroup_{parallel}"]
        assert (rank, world) == (0, 1)
        _assert_close_states(trained, reference, atol=1e-12)
        assert out[f"subgroup_{parallel}_resumes_at"] == SUBGROUP_STEPS  # saved in that group


def _launcher_variables(monkeypatch, world: int) -> None:
    assert not dist.is_initialized()
    for name, value in (
        ("RANK", "0"),
        ("WORLD_SIZE", str(world)),
        ("MASTER_ADDR", "127.0.0.1"),
        ("MASTER_PORT", str(free_port())),
    ):
        monkeypatch.setenv(name, value)


def test_a_group_the_handle_creates_carries_its_timeout(monkeypatch):
    _launcher_variables(monkeypatch, 1)
    h = handle(init_process_group=True, timeout=45)
    try:
        assert default_group_timeout() == timedelta(seconds=45)
    finally:
        h.close()
    assert not dist.is_initialized()


def test_a_group_the_handle_creates_waits_for_a_missing_rank_only_its_timeout(monkeypatch):
    _launcher_variables(monkeypatch, 2)  # rank 1 never comes
    started = time.monotonic()
    with pytest.raises(dist.DistStoreError, match="1/2 clients joined"):
        handle(init_process_group=True, timeout=1)
    assert time.monotonic() - started < 10  # torch's default would wait 30 minutes
