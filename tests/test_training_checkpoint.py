"""Training checkpoints (torch.distributed.checkpoint) of the streaming handle on a real
cluster: a rank killed with SIGKILL while it writes a checkpoint leaves that checkpoint torn;
after restart() the run resumes from the one before, and on CPU at the same world size its
losses are the uninterrupted run's bit for bit; the same checkpoint resumes on one process."""

import os
import signal

import numpy as np
import pytest

from mixle_nb.cluster import RankDiedError
from mixle_nb.neural import StreamingTransformerLeafEstimator, build_causal_lm
from mixle_nb.parallel import StreamingTokenEncodedData

VOCAB, BLOCK, BATCH, LR, SEED, EVERY, STEPS = 11, 16, 8, 1e-2, 7, 20, 50
# a cycle through the vocabulary with 10% of the tokens shifted: a loss that falls far below
# log(VOCAB) once learned, so a resumed model is told from a fresh one
TOKENS = ((np.arange(3200) % VOCAB + (np.random.default_rng(0).random(3200) < 0.1)) % VOCAB).astype(np.int64)


# ---- run on the ranks


def train(root, steps, **options):
    """[(step, loss)] of ``steps`` optimizer steps (from the checkpoint in ``root``, if any)."""
    losses = []
    estimator = StreamingTransformerLeafEstimator(
        build_causal_lm(VOCAB, d_model=32, n_layer=2, n_head=2, block=BLOCK, seed=0), lr=LR
    )
    handle = StreamingTokenEncodedData(
        TOKENS,
        block=BLOCK,
        batch_size=BATCH,
        seed=SEED,
        epochs=30,
        max_steps=steps,
        progress=losses.append,
        progress_every=1,
        checkpoint=root,
        checkpoint_every=EVERY,
        **options,
    )
    handle.pysp_seq_estimate(estimator, None)
    return [(p["step"], p["loss"]) for p in losses]


def die_in_checkpoint_write(nth):
    """SIGKILL this engine inside the ``nth`` checkpoint write from now (DCP's file writer)."""
    from torch.distributed.checkpoint.filesystem import FileSystemWriter

    writes, write_data = [], FileSystemWriter.write_data

    def dying(self, plan, planner):
        writes.append(1)
        if len(writes) == nth:
            os.kill(os.getpid(), signal.SIGKILL)
        return write_data(self, plan, planner)

    FileSystemWriter.write_data = dying


# ---- the tests


def checkpoint_dirs(root):
    return {name: os.path.exists(os.path.join(root, name, ".metadata")) for name in sorted(os.listdir(root))}


@pytest.mark.cluster
def test_a_rank_killed_mid_save_resumes_from_the_checkpoint_before_bit_for_bit(cluster2, tmp_path):
    root = str(tmp_path / "run")
    whole = cluster2.run(train, None, STEPS)  # no checkpoints at all; each rank's own losses
    cluster2.run(die_in_checkpoint_write, 2, targets=[1])
    try:
        with pytest.raises(RankDiedError, match="rank 1 died"):
            cluster2.run(train, root, STEPS)
    finally:
        cluster2.restart()
    assert checkpoint_dirs(root) == {"step-00000020": True, "step-00000040": False}  # 40 is torn

    resumed = cluster2.run(train, root, STEPS - EVERY)
    assert resumed == [losses[EVERY:] for losses in whole]  # steps 21..50, bit for bit
    assert checkpoint_dirs(root) == {"step-00000020": True, "step-00000040": True}

    # on one process (DCP reshards: here it only gathers): trains on from step 40
    alone = train(root, 5, init_process_group=False)
    assert [s for s, _ in alone] == list(range(41, 46))
    fresh = train(None, 5, init_process_group=False)
    last = np.mean([loss for losses in whole for _, loss in losses[-5:]])
    assert abs(np.mean([loss for _, loss in alone]) - last) < 0.25 * last
    assert np.mean([loss for _, loss in alone]) < 0.5 * np.mean([loss for _, loss in fresh])


@pytest.mark.cluster
def test_an_fsdp2_checkpoint_of_two_ranks_resumes_on_one_process(cluster2, tmp_path):
    """Under FSDP2 each rank saves only its shards; DCP gathers them into a whole module here."""
    root = str(tmp_path / "fsdp")
    sharded = cluster2.run(train, root, EVERY, parallel="fsdp")
    assert checkpoint_dirs(root) == {"step-00000020": True}
    alone = train(root, 5, init_process_group=False)
    assert [s for s, _ in alone] == list(range(EVERY + 1, EVERY + 6))
    last = np.mean([loss for losses in sharded for _, loss in losses[-5:]])
    assert abs(np.mean([loss for _, loss in alone]) - last) < 0.25 * last


def build_panel_handle(root):
    """A handle of 60 steps (5 epochs) checkpointing every 20 into ``root``, and a new module."""
    from mixle_nb.cluster.rank_side import rank_namespace

    rank_namespace().update(
        ck_handle=StreamingTokenEncodedData(
            TOKENS, block=BLOCK, batch_size=BATCH, seed=SEED, epochs=5, checkpoint=root, checkpoint_every=EVERY
        ),
        ck_estimator=StreamingTransformerLeafEstimator(
            build_causal_lm(VOCAB, d_model=32, n_layer=2, n_head=2, block=BLOCK, seed=0), lr=LR
        ),
    )


@pytest.mark.cluster
def test_a_train_panel_attached_to_a_checkpointing_handle_redraws_the_lost_steps_as_they_were(cluster2, tmp_path):
    import shutil

    from mixle_nb.widgets import TrainPanel

    root = str(tmp_path / "panel")
    cluster2.run(build_panel_handle, root)
    panel = TrainPanel(cluster2, handle="ck_handle", estimator="ck_estimator", chunk_steps=EVERY, report_every=1)
    panel.train()
    # the panel draws the reports it sees (ipyparallel's data channel keeps the latest), and each
    # chunk's last: every point is (step, targets, that step's loss)
    whole = {r: {s: (t, loss) for s, t, loss in points} for r, points in panel.points.items()}
    assert {20, 40, 60} <= set(whole[0]) and max(whole[0]) == 60
    shutil.rmtree(os.path.join(root, "step-00000060"))  # as if the ranks died before saving it

    cluster2.run(build_panel_handle, root)  # as after restart(): a new handle and module
    panel.attach(handle="ck_handle", estimator="ck_estimator")
    assert max(s for s, _, _ in panel.points[0]) == 40  # cut back to the checkpoint
    panel.train()
    for rank, points in panel.points.items():  # steps 41..60 again, bit for bit, targets counted on
        again = {s: (t, loss) for s, t, loss in points if s > 40}
        assert 60 in again
        assert {s: again[s] for s in set(again) & set(whole[rank])} == {
            s: whole[rank][s] for s in set(again) & set(whole[rank])
        }


def test_a_local_train_panel_attached_to_a_checkpointing_handle_resumes_from_it(tmp_path):
    """The same without a cluster: the panel's one local call per Train resumes from the handle's
    checkpoint after attach, and steps 21..48 come again bit for bit."""
    import shutil

    from mixle_nb.widgets import TrainPanel

    root = str(tmp_path / "local")

    def objects():  # 24 steps an epoch on one process
        return dict(
            handle=StreamingTokenEncodedData(
                TOKENS,
                block=BLOCK,
                batch_size=BATCH,
                seed=SEED,
                epochs=2,
                checkpoint=root,
                checkpoint_every=EVERY,
                init_process_group=False,
            ),
            estimator=StreamingTransformerLeafEstimator(
                build_causal_lm(VOCAB, d_model=32, n_layer=2, n_head=2, block=BLOCK, seed=0), lr=LR
            ),
        )

    panel = TrainPanel(**objects(), report_every=1)
    panel.train()
    whole = {s: (t, loss) for s, t, loss in panel.points[0]}
    assert sorted(whole) == list(range(1, 49))
    shutil.rmtree(os.path.join(root, "step-00000040"))
    panel.attach(**objects())
    assert max(s for s, _, _ in panel.points[0]) == 20  # cut back to the checkpoint
    assert "from the checkpoint of step 20" in panel.status.value
    panel.train()
    assert panel.error is None
    assert {s: (t, loss) for s, t, loss in panel.points[0]} == whole
