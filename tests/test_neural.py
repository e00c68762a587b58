"""The tiny causal LM, the streamed window source, the fitted leaf and the tokenizer."""

import pickle
import tracemalloc

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from mixle_nb.neural import (
    CharTokenizer,
    StreamingTransformerLeaf,
    StreamingTransformerLeafEstimator,
    build_causal_lm,
    stdlib_text,
    stream_sequence_source,
    stream_token_source,
)
from mixle_nb.neural.source import epoch_keys, permuted_indices

torch.set_num_threads(1)


def naive_windows(tokens, block):
    """Every (context, next) window, by per-window Python: the independent reference."""
    ctx = np.stack([tokens[i : i + block] for i in range(len(tokens) - block)])
    return ctx, tokens[block:]


@pytest.mark.parametrize("n", [1, 2, 3, 17, 64, 1000])
def test_permutation_is_a_bijection(n):
    perm = permuted_indices(np.arange(n), n, epoch_keys(3, 1))
    assert sorted(perm.tolist()) == list(range(n))


def test_source_unshuffled_matches_naive_windows_in_order():
    tokens = np.random.default_rng(0).integers(0, 50, 103)
    got = list(stream_token_source(tokens, 7, 10, shuffle=False))
    ctx, nxt = naive_windows(tokens, 7)
    np.testing.assert_array_equal(np.concatenate([c for c, _ in got]), ctx)
    np.testing.assert_array_equal(np.concatenate([n for _, n in got]), nxt)
    assert [len(n) for _, n in got] == [10] * 9 + [6]


def test_source_shuffled_visits_every_window_once_per_epoch_in_new_orders():
    tokens = np.arange(60) * 7 % 61  # distinct ids, so a window is identified by its first token
    batches = list(stream_token_source(tokens, 5, 8, epochs=2, seed=1, drop_last=True))
    assert len(batches) == 2 * (55 // 8) and all(len(n) == 8 for _, n in batches)
    ref_ctx, ref_next = naive_windows(tokens, 5)
    lookup = {int(c[0]): (c, n) for c, n in zip(ref_ctx, ref_next)}
    epochs = [np.concatenate([c[:, 0] for c, _ in batches[k * 6 : (k + 1) * 6]]) for k in range(2)]
    for firsts in epochs:
        assert len(set(firsts.tolist())) == 48
    assert not np.array_equal(epochs[0], epochs[1])
    for ctx, nxt in batches:
        for c, n in zip(ctx, nxt):
            np.testing.assert_array_equal(c, lookup[int(c[0])][0])
            assert n == lookup[int(c[0])][1]


def _source_peak_bytes(n_tokens):
    tokens = np.random.default_rng(0).integers(0, 100, n_tokens).astype(np.int64)
    source = stream_token_source(tokens, 32, 64, seed=0)
    tracemalloc.start()
    for _ in range(50):
        next(source)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return peak


def test_source_peak_memory_does_not_grow_with_token_count():
    small, large = _source_peak_bytes(20_000), _source_peak_bytes(2_000_000)
    # Both hold one chunk of offsets and one batch; a permutation at 2M tokens alone is 16 MB.
    assert large < 1.2 * small + 16_384
    assert large < 2_000_000


def test_source_rejects_bad_input():
    with pytest.raises(ValueError, match="block=10 must be smaller"):
        next(stream_token_source(np.arange(10), 10, 2))
    with pytest.raises(ValueError, match="batch_size must be a positive int"):
        next(stream_token_source(np.arange(10), 3, 0))
    with pytest.raises(TypeError, match="must hold integers"):
        next(stream_token_source(np.linspace(0, 1, 10), 3, 2))
    with pytest.raises(ValueError, match="negative"):
        next(stream_token_source(np.arange(-1, 9), 3, 2))


def test_build_is_seeded_and_leaves_global_rng_alone():
    state = torch.get_rng_state()
    a, b, c = (
        build_causal_lm(11, 16, 2, 2, 8),
        build_causal_lm(11, 16, 2, 2, 8),
        build_causal_lm(11, 16, 2, 2, 8, seed=1),
    )
    assert torch.equal(torch.get_rng_state(), state)
    for pa, pb, _pc in zip(a.parameters(), b.parameters(), c.parameters()):
        assert torch.equal(pa, pb)
    assert any(not torch.equal(pa, pc) for pa, pc in zip(a.parameters(), c.parameters()))
    assert len(a.blocks) == 2
    with pytest.raises(ValueError, match="divisible"):
        build_causal_lm(11, 10, 2, 3, 8)


def test_attention_matches_explicit_masked_softmax():
    model = build_causal_lm(13, 16, 1, 4, 8)
    attn = model.blocks[0].attn
    x = torch.randn(3, 8, 16, generator=torch.Generator().manual_seed(0))
    q, k, v = attn.qkv(x).view(3, 8, 3, 4, 4).permute(2, 0, 3, 1, 4)
    scores = q @ k.transpose(-1, -2) / 2.0
    scores = scores.masked_fill(torch.ones(8, 8).triu(1).bool(), float("-inf"))
    ref = attn.proj((scores.softmax(-1) @ v).transpose(1, 2).reshape(3, 8, 16))
    torch.testing.assert_close(attn(x), ref, atol=1e-6, rtol=1e-5)


def test_logits_depend_on_the_whole_context_row_by_row():
    model = build_causal_lm(13, 16, 2, 2, 8).eval()
    ctx = torch.randint(0, 13, (4, 8), generator=torch.Generator().manual_seed(0))
    out = model(ctx)
    assert out.shape == (4, 13)
    changed = ctx.clone()
    changed[:, 0] = (changed[:, 0] + 1) % 13
    assert not torch.allclose(model(changed), out)  # the first token is attended to
    torch.testing.assert_close(model(ctx[1:2]), out[1:2])  # rows are independent


def test_activation_checkpointing_gives_the_same_gradients():
    ctx = torch.randint(0, 13, (4, 8), generator=torch.Generator().manual_seed(0))
    nxt = torch.randint(0, 13, (4,), generator=torch.Generator().manual_seed(1))
    grads = []
    for ckpt in (False, True):
        model = build_causal_lm(13, 16, 2, 2, 8)
        model.activation_checkpointing = ckpt
        F.cross_entropy(model(ctx), nxt).backward()
        grads.append([p.grad for p in model.parameters()])
    for g0, g1 in zip(*grads):
        torch.testing.assert_close(g0, g1, atol=1e-6, rtol=1e-5)


def test_leaf_scores_predicts_and_generates():
    model = build_causal_lm(9, 16, 2, 2, 6)
    leaf = StreamingTransformerLeaf(model, "cpu")
    ctx = np.random.default_rng(0).integers(0, 9, (5, 6))
    nxt = np.array([0, 1, 2, 3, 8])
    with torch.no_grad():
        ref = F.log_softmax(model(torch.from_numpy(ctx)), -1)[torch.arange(5), torch.from_numpy(nxt)]
    np.testing.assert_allclose(leaf.seq_log_density((ctx, nxt)), ref.numpy(), atol=1e-6)
    np.testing.assert_array_equal(leaf.predict(ctx), model(torch.from_numpy(ctx)).argmax(-1).numpy())
    out = leaf.generate([1, 2], 10, temperature=1.0, seed=5)
    assert len(out) == 12 and out[:2].tolist() == [1, 2] and out.max() < 9
    np.testing.assert_array_equal(out, leaf.generate([1, 2], 10, temperature=1.0, seed=5))
    greedy = leaf.generate([1, 2], 3, temperature=0)
    assert greedy[2] == leaf.predict(np.array([[1, 2]]))[0]


def test_estimator_pickles_with_its_module():
    est = StreamingTransformerLeafEstimator(build_causal_lm(7, 8, 1, 2, 4), lr=1e-3)
    back = pickle.loads(pickle.dumps(est))
    assert back.lr == 1e-3 and back.device == "cpu"
    for p, q in zip(est.module.parameters(), back.module.parameters()):
        assert torch.equal(p, q)
    with pytest.raises(TypeError, match="torch.nn.Module"):
        StreamingTransformerLeafEstimator("not a module")


def test_char_tokenizer_round_trips_stdlib_text():
    text = stdlib_text(5000)
    assert len(text) == 5000
    tok = CharTokenizer.fit(text)
    ids = tok.encode(text)
    assert ids.dtype == np.uint8 and ids.max() < tok.vocab_size
    assert tok.decode(ids) == text
    with pytest.raises(ValueError, match="not in the tokenizer's alphabet"):
        CharTokenizer("ab").encode("abc")


def test_sequence_source_unshuffled_is_consecutive_blocks_with_shifted_targets():
    tokens = np.random.default_rng(0).integers(0, 50, 103)
    got = list(stream_sequence_source(tokens, 7, 4, shuffle=False))
    n_windows = 103 // 7 - 1  # windows of 8 tokens starting at 0, 7, 14, ...
    inputs = np.concatenate([x for x, _ in got])
    targets = np.concatenate([y for _, y in got])
    np.testing.assert_array_equal(inputs, np.stack([tokens[7 * i : 7 * i + 7] for i in range(n_windows)]))
    np.testing.assert_array_equal(targets, np.stack([tokens[7 * i + 1 : 7 * i + 8] for i in range(n_windows)]))
    assert [len(x) for x, _ in got] == [4, 4, 4, 1]


def test_sequence_source_epoch_predicts_each_token_about_once_from_a_new_offset():
    block, n = 5, 61
    tokens = np.arange(n)  # a token's id is its position
    batches = list(stream_sequence_source(tokens, block, 3, epochs=6, seed=2, drop_last=False))
    n_windows = n // block - 1
    per_epoch = -(-n_windows // 3)
    offsets = set()
    for epoch in range(6):
        inputs = np.concatenate([x for x, _ in batches[epoch * per_epoch : (epoch + 1) * per_epoch]])
        targets = np.concatenate([y for _, y in batches[epoch * per_epoch : (epoch + 1) * per_epoch]])
        np.testing.assert_array_equal(targets, inputs + 1)  # every position's next token
        starts = np.sort(inputs[:, 0])
        assert np.all(np.diff(starts) == block) and 0 <= starts[0] < block  # tiles without overlap
        predicted = np.sort(targets.ravel())
        assert len(predicted) == n_windows * block and len(np.unique(predicted)) == len(predicted)
        assert len(predicted) >= n - 2 * block  # each token once, bar at most the two ends
        offsets.add(int(starts[0]))
    assert len(offsets) > 1  # window boundaries move between epochs


def test_every_position_logits_match_the_last_position_of_each_prefix():
    model = build_causal_lm(13, 16, 2, 2, 8).eval()
    ctx = torch.randint(0, 13, (3, 8), generator=torch.Generator().manual_seed(0))
    every = model(ctx, return_all_logits=True)
    assert every.shape == (3, 8, 13)
    for j in range(8):  # position j sees tokens 0..j only (the causal mask)
        torch.testing.assert_close(every[:, j], model(ctx[:, : j + 1]), atol=1e-5, rtol=1e-5)
