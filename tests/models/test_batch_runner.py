"""The batched native runner: every sequence's rows in a batched forward equal its solo forward.

Three sequences of different lengths (3, 9, 17 tokens) go through the same steps alone (one
``NativeLlamaRunner`` each) and together (one ``BatchedLlamaRunner``, one forward per step):
a packed prefill, a draft tree per sequence (different shapes, so the attention is padded), a
commit of a path (entries moved down per slot), single-token steps, a slot closed in the middle
(the last slot moves into it), a sequence joining while the others decode and a long prompt joining
beside a small tree (its attention runs on its own: ``attended_alone``; with ``call_keys`` 0 every
request runs on its own in every step). Measured maxima of
|batched - solo| over the logits: float64 0.0 (asserted < 1e-12), fp32 2.4e-7 (asserted < 1e-4,
logits of scale ~10): the batched products run over more rows and may round differently.
"""

import pytest
import torch

from tests.engine.tiny import tiny_llama
from verispec.errors import ConfigError
from verispec.models import batch_runner
from verispec.models.batch_runner import BatchedLlamaRunner
from verispec.models.hf import TransformersRunner, tree_attention_mask
from verispec.models.native_llama import NativeLlamaRunner

PROMPTS = [[1, 4, 2], [3, 3, 0, 5, 1, 2, 2, 4, 1], [(7 * i) % 6 for i in range(17)]]
# (tokens below the root, parents) of each sequence's draft tree: node 0 is the root
TREES = [([2, 5, 1], [0, 0, 1]), ([4], [0]), ([0, 3, 3, 1, 2], [0, 1, 1, 2, 0])]


def tree_request(cached: int, tokens, parents):
    """Inputs, positions and mask of a tree [root, tokens] scored below ``cached`` entries."""
    ancestors, depths = [[0]], [0]
    for node, parent in enumerate(parents, start=1):
        ancestors.append(ancestors[parent] + [node])
        depths.append(depths[parent] + 1)
    allowed = tree_attention_mask(cached, 0, ancestors, len(ancestors))
    return [cached + d for d in depths], allowed


def run_both(dtype, whole_buffers=True, call_keys=batch_runner.ALONE_CALL_KEYS, decisions=None):
    """(largest |batched - solo| over every step's logits, number of compared rows); ``decisions``
    collects (requests, requests attended alone) of every batched forward."""
    batch_runner.WHOLE_BUFFER_SLACK = float("inf") if whole_buffers else 0.0
    batch_runner.ALONE_CALL_KEYS = call_keys
    if decisions is not None:
        choose = batch_runner.attended_alone

        def spy(sizes, *args):
            alone = choose(sizes, *args)
            decisions.append((len(sizes), len(alone)))
            return alone

        batch_runner.attended_alone = spy
    model = tiny_llama(3, vocab_size=6).to(dtype)
    solo = [NativeLlamaRunner(model) for _ in PROMPTS]
    batch = BatchedLlamaRunner(solo[0], initial_slots=2)  # 3 sequences: the slots grow once
    slots = [batch.open() for _ in PROMPTS]
    errors, rows = [], 0

    def step(requests):
        """requests: {sequence: (ids, positions, allowed, keep)}; one batched forward vs solo ones."""
        nonlocal rows
        for seq, (ids, positions, allowed, keep) in requests.items():
            batch.submit(slots[seq].slot, ids, positions, allowed, keep)
        batch.flush()
        for seq, (ids, positions, allowed, keep) in requests.items():
            together = batch.take_result(slots[seq].slot)
            alone = solo[seq].forward(ids, positions, allowed, keep)
            errors.append(float((together - alone).abs().max()))
            rows += keep

    step({s: (p, list(range(len(p))), None, len(p)) for s, p in enumerate(PROMPTS)})
    # a tree per sequence (roots = a fresh token at the next position)
    step({s: (
        [0] + TREES[s][0], *tree_request(len(PROMPTS[s]), *TREES[s]), len(TREES[s][0]) + 1,
    ) for s in range(3)})
    # commit root + a path per sequence: keep [0, len + 1) then the path's entries
    paths = [[1, 3], [], [2, 4]]
    for s, path in enumerate(paths):
        base = len(PROMPTS[s])
        for runner in (solo[s], slots[s]):
            runner.keep_entries(base + 1, [base + n for n in path])
    lengths = [len(PROMPTS[s]) + 1 + len(paths[s]) for s in range(3)]
    for _ in range(2):
        step({s: ([s + 1], [lengths[s]], None, 1) for s in range(3)})
        lengths = [n + 1 for n in lengths]
    step({0: ([3, 1, 4], *tree_request(lengths[0], [1, 4], [0, 0]), 3), 2: ([2], [lengths[2]], None, 1)})
    solo[0].keep_entries(lengths[0] + 1, [lengths[0] + 2])
    slots[0].keep_entries(lengths[0] + 1, [lengths[0] + 2])
    lengths[0] += 2
    lengths[2] += 1
    step({1: ([4], [lengths[1]], None, 1), 2: ([0, 3], [lengths[2], lengths[2] + 1], None, 2)})  # slots 1 and 2
    lengths[1] += 1
    lengths[2] += 2
    # sequence 0 leaves: the last slot moves into its place; a new sequence joins
    batch.close(slots[0])
    assert slots[2].slot == 0 and batch.lengths == [lengths[2], lengths[1]]
    solo.append(NativeLlamaRunner(model))
    slots.append(batch.open())
    step({1: ([2, 2], [lengths[1], lengths[1] + 1], None, 2), 2: ([5], [lengths[2]], None, 1), 3: ([1, 2, 3, 4], [0, 1, 2, 3], None, 1)})
    lengths[1] += 2
    lengths[2] += 1
    # a long prompt joins beside a tree and a single step: padded, every slot would pay its 40 rows
    solo.append(NativeLlamaRunner(model))
    slots.append(batch.open())
    long_prompt = [(5 * i + 2) % 6 for i in range(40)]
    step({1: ([0, 2, 1], *tree_request(lengths[1], [2, 1], [0, 1]), 3), 2: ([3], [lengths[2]], None, 1),
          3: ([2], [4], None, 1), 4: (long_prompt, list(range(40)), None, 40)})
    return max(errors), rows


@pytest.fixture
def restore_slack():
    slack, call_keys, choose = batch_runner.WHOLE_BUFFER_SLACK, batch_runner.ALONE_CALL_KEYS, batch_runner.attended_alone
    yield
    batch_runner.WHOLE_BUFFER_SLACK, batch_runner.ALONE_CALL_KEYS, batch_runner.attended_alone = slack, call_keys, choose


@pytest.mark.parametrize("call_keys", [batch_runner.ALONE_CALL_KEYS, 0])
@pytest.mark.parametrize("whole_buffers", [True, False])
def test_batched_rows_equal_solo_rows_float64(whole_buffers, call_keys, restore_slack):
    decisions = []
    error, rows = run_both(torch.float64, whole_buffers, call_keys, decisions)
    assert rows > 60
    assert error < 1e-12
    if call_keys:  # padded, all alone (the prompts) and mixed (the long prompt beside the others) forwards
        assert {alone == 0 for _, alone in decisions} == {True, False} and any(0 < a < n for n, a in decisions)
    else:
        assert all(alone == n for n, alone in decisions)


@pytest.mark.parametrize("call_keys", [batch_runner.ALONE_CALL_KEYS, 0])
@pytest.mark.parametrize("whole_buffers", [True, False])
def test_batched_rows_equal_solo_rows_fp32(whole_buffers, call_keys, restore_slack):
    error, _ = run_both(torch.float32, whole_buffers, call_keys)
    assert error < 1e-4


def test_attended_alone_takes_the_largest_requests_when_padding_costs_more():
    alone = batch_runner.attended_alone
    assert alone([2, 2, 2, 2], [302, 282, 262, 322], 512) == set()  # similar small trees: one padded call
    assert alone([8, 4, 2, 2], [308, 284, 262, 322], 322) == set()
    assert alone([25, 1, 1, 1], [325, 281, 261, 321], 325) == {0}
    assert alone([15, 141, 12, 18], [215, 141, 192, 238], 238) == {1}  # a joining prompt beside small trees
    assert alone([222, 191, 161, 213], [222, 191, 161, 213], 256) == {0, 1, 2, 3}  # prompts: each its own
    assert alone([5], [20], 32) == set()
    assert alone([3, 1], [40, 40], 64, call_keys=0) == {0, 1}


def test_bad_use_is_a_clear_error():
    model = tiny_llama(3, vocab_size=6)
    batch = BatchedLlamaRunner(NativeLlamaRunner(model))
    slot = batch.open()
    batch.submit(slot.slot, [1], [0], None, 1)
    with pytest.raises(ConfigError, match="already has a forward queued"):
        batch.submit(slot.slot, [1], [0], None, 1)
    with pytest.raises(ConfigError, match="cannot be closed"):
        batch.close(slot)
    batch.flush()
    with pytest.raises(ConfigError, match="no flushed forward"):
        batch.take_result(1)
    with pytest.raises(ConfigError, match="transformers forward cannot batch"):
        BatchedLlamaRunner(TransformersRunner(model))


def test_stacked_products_are_built_once_and_shared():
    """The batched runner's stacked q|k|v and gate|up products are built at the first use, shared by
    runners that share the base's packed weights (a batch per call must not rebuild them), and give
    the separate products' outputs side by side."""
    model = tiny_llama(2, vocab_size=6).to(torch.bfloat16)
    first, second = NativeLlamaRunner(model), NativeLlamaRunner(model)
    if not second.share_weights_from(first):
        pytest.skip("no oneDNN weight packing here: runners do not share weights")
    assert first._fused is None  # nothing stacked before a batched forward
    stacked = BatchedLlamaRunner(second).base.fused_linears()
    assert stacked is first.fused_linears() is second.fused_linears() and len(stacked) == 2
    x = torch.linspace(-2, 2, 3 * 32).reshape(1, 3, 32).to(torch.bfloat16)
    for (qkv, gate_up), linears in zip(stacked, first.linears):
        separate = [torch.cat([linears[i](x) for i in group], dim=-1) for group in ((0, 1, 2), (4, 5))]
        for together, apart in zip((qkv(x), gate_up(x)), separate):
            assert torch.allclose(together.float(), apart.float(), atol=1e-2)
