"""Elastic streaming training (issue 30) on a real 3-engine cluster: a rank killed with SIGKILL
mid-chunk, and TrainPanel(elastic=True) goes on on the 2 survivors from the newest checkpoint,
each on its new slice of the token file; handles that cannot go on are refused before any step,
on every rank, saying what to pass."""

import os
import signal

import numpy as np
import pytest

from mixle_nb.cluster import MixleCluster, rank_side
from mixle_nb.neural import StreamingTransformerLeafEstimator, build_causal_lm
from mixle_nb.parallel import StreamingTokenEncodedData

pytestmark = pytest.mark.cluster

VOCAB, BLOCK, BATCH, LR, SEED, EVERY, EPOCHS, DIES_AT = 11, 16, 8, 1e-2, 7, 10, 4, 25
# a cycle through the vocabulary with 10% of the tokens shifted (as in test_training_checkpoint):
# the loss falls far below log(VOCAB) once learned, so a resumed model is told from a fresh one
TOKENS = ((np.arange(3200) % VOCAB + (np.random.default_rng(0).random(3200) < 0.1)) % VOCAB).astype(np.int64)


# ---- run on the ranks


def estimator():
    return StreamingTransformerLeafEstimator(
        build_causal_lm(VOCAB, d_model=32, n_layer=2, n_head=2, block=BLOCK, seed=0), lr=LR
    )


def build(path=None, checkpoint=None):
    """Bind ``h`` (from the file ``path``, else from memory) and ``est`` on this rank."""
    from mixle_nb.cluster.rank_side import rank_namespace

    options = dict(
        block=BLOCK, batch_size=BATCH, seed=SEED, epochs=EPOCHS, checkpoint=checkpoint, checkpoint_every=EVERY
    )
    h = StreamingTokenEncodedData.from_file(path, **options) if path else StreamingTokenEncodedData(TOKENS, **options)
    rank_namespace().update(h=h, est=estimator())


def watch_steps(die_at=None, stamp=None):
    """Record the step each optimizer step of ``h`` starts from (in ``seen``); SIGKILL this
    engine when it reaches ``die_at``, first writing the time to the file ``stamp`` if given."""
    import time

    from mixle_nb.cluster.rank_side import lookup, rank_namespace

    h, seen = lookup("h"), rank_namespace().setdefault("seen", [])
    loss = h._loss

    def watched(tr, autocast):
        if tr.step == die_at:
            if stamp:
                with open(stamp, "w") as f:
                    f.write(repr(time.time()))
            os.kill(os.getpid(), signal.SIGKILL)
        seen.append(tr.step)
        return loss(tr, autocast)

    h._loss = watched


def seen_steps():
    from mixle_nb.cluster.rank_side import lookup

    return lookup("seen")


def uninterrupted(path, steps):
    """Per-step losses of one process training the same file for ``steps`` steps, no failure."""
    losses = []
    h = StreamingTokenEncodedData.from_file(
        path,
        block=BLOCK,
        batch_size=BATCH,
        seed=SEED,
        epochs=30,
        max_steps=steps,
        progress=losses.append,
        progress_every=1,
        init_process_group=False,
    )
    h.pysp_seq_estimate(estimator(), None)
    return {p["step"]: p["loss"] for p in losses}


# ---- the tests


@pytest.fixture(scope="module")
def token_file(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("elastic_training") / "tokens.npy")
    np.save(path, TOKENS)
    return path


@pytest.fixture(scope="module")
def cluster3():
    with MixleCluster(3, timeout=20.0) as cluster:
        yield cluster


@pytest.mark.parametrize(
    "source, checkpoint, says",
    [
        ("file", None, r"built without checkpoint=; .*from_file\(path, \.\.\., checkpoint=DIR\)"),
        ("memory", "ck", r"tokens passed from memory, .*from_file\(path, \.\.\., checkpoint=DIR\)"),
    ],
)
def test_a_handle_that_cannot_go_on_is_refused_on_every_rank(cluster3, token_file, tmp_path, source, checkpoint, says):
    from mixle_nb.widgets import TrainPanel

    cluster3.run(
        build, token_file if source == "file" else None, None if checkpoint is None else str(tmp_path / checkpoint)
    )
    with pytest.raises(Exception, match=says) as caught:
        TrainPanel(cluster3, handle="h", estimator="est", elastic=True)
    assert all(f"rank {r}" in str(caught.value) for r in range(3)), caught.value
    assert not os.path.exists(tmp_path / "ck")  # refused before any step


def test_a_rank_killed_mid_training_and_the_survivors_go_on_from_the_newest_checkpoint(cluster3, token_file, tmp_path):
    from mixle_nb.widgets import TrainPanel

    cluster3.run(build, token_file, str(tmp_path / "ck"))
    cluster3.run(watch_steps)
    cluster3.run(watch_steps, DIES_AT, targets=[2])
    panel = TrainPanel(cluster3, handle="h", estimator="est", chunk_steps=EVERY, report_every=1, elastic=True)
    panel.train()
    assert panel.error is None, panel.error
    assert cluster3.n == 2

    [event] = panel.recoveries
    assert event.lost == [[2]] and event.world == 2
    assert event.resumed_from == 20  # each chunk of 10 ends with its checkpoint complete
    assert event.at_step >= 20 and event.seconds > 0
    [row] = [r for r in panel.history_rows() if r["kind"] == "recovery"]
    assert row["rank"] == [2] and "resumed from the checkpoint of step 20" in row["recovery"]

    # 3 ranks: 8 steps an epoch; 2 ranks, each on half the file: 12 (the data position is the step)
    done = cluster3.run(rank_side.training_progress_on_rank, "h")
    assert done == [{"steps_done": EPOCHS * 12, "total_steps": EPOCHS * 12}] * 2
    for seen in cluster3.run(seen_steps):  # steps 0..25 on 3 ranks (25 cut by the death), then 20..47 on 2
        assert seen == list(range(DIES_AT + 1)) + list(range(20, EPOCHS * 12))

    # the losses after the resume: finite, and within noise of one process's uninterrupted run
    # (another batch order, so not bit for bit): the mean over steps 21..47 within 25%
    after = [loss for pts in panel.points.values() for s, _, loss in pts if s > 20]
    assert after and np.isfinite(after).all()
    reference = uninterrupted(token_file, EPOCHS * 12)
    ref = np.mean([loss for s, loss in reference.items() if s > 20])
    assert abs(np.mean(after) - ref) < 0.25 * ref, (np.mean(after), ref)
    assert np.mean(after) < 0.5 * np.log(VOCAB)  # it went on from the trained model, not a fresh one
