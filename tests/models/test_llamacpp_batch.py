"""Batched decoding on llama.cpp (``models.llamacpp_batch``, ``engine.batch``): every sequence of a
batch gets exactly the rows and tokens it gets decoded alone.

* rows: three sequences (prompts of 9, 23 and 5 tokens) with random trees and random accepted
  paths, one leaving and one joining mid-way, each round's forwards as one ``llama_decode``: on the
  real default GGUF (Q4_1, F16 cache, flash attention: batch-invariant kernels) every row equals
  the sequence's solo row bit for bit; on the tiny F32 GGUF within the F32 kernels' batch variance;
* greedy engine output on the tiny GGUF (branching token trees, max_batch 2 so that a sequence
  joins when another finishes) and on the real default GGUF equals solo output;
* exact law: the replay enumerator drives sequence 1 of a batch of two (SD with the n-gram draft);
  its law equals its solo law and the target's law (within the F32 kernels' batch variance);
* bad input ends its own sequence only; a full shared cache is a clear error.
"""

from __future__ import annotations

import random
import threading

import numpy as np
import pytest

from tests.models.test_llamacpp import (  # noqa: F401  (fixtures)
    FREE_TREES,
    GREEDY_TOKENS,
    LOGIT_TOLERANCE,
    LAW_PROMPT,
    LAW_TOKENS,
    default_gguf,
    engine_law,
    gguf_files,
    open_adapter,
)
from verispec.core.rng import SeededRng, enumerate_outcomes
from verispec.core.sampling import SamplingParams
from verispec.engine.decoder import SpeculativeDecoder
from verispec.engine.drafters import TokenTreeDrafter
from verispec.errors import ConfigError
from verispec.models.llamacpp import LlamaCppAdapter, llamacpp_available
from verispec.models.llamacpp_batch import LlamaCppBatch
from verispec.theory.enumerate import max_abs_difference

pytestmark = pytest.mark.skipif(llamacpp_available() is not None, reason=str(llamacpp_available()))

VOCAB = 16


def script(seed: int, prompt_len: int, rounds: int = 6, vocab: int = VOCAB) -> dict:
    """A prompt and rounds of (tree tokens, parents, commit path, next token), from ``seed``."""
    rng = random.Random(seed)
    steps = []
    for _ in range(rounds):
        tokens, parents = [-1], [-1]
        for node in range(1, rng.randint(1, 9)):
            tokens.append(rng.randrange(3, vocab))
            parents.append(rng.randrange(0, node))
        node, path = rng.randrange(0, len(parents)), []
        while node > 0:
            path.append(node)
            node = parents[node]
        steps.append((tokens, parents, path[::-1], rng.randrange(3, vocab)))
    return {"prompt": [rng.randrange(3, vocab) for _ in range(prompt_len)], "steps": steps}


def play(adapter, step) -> np.ndarray:
    tokens, parents, path, next_token = step
    rows = adapter.extend(tokens, parents).numpy()
    adapter.commit(path, next_token)
    return rows


def batched_rows(batch: LlamaCppBatch, scripts: list[dict], leave_after: int) -> list[list[np.ndarray]]:
    """Rows of every script decoded in ``batch``: sequences 0 and 1 start, 1 leaves after
    ``leave_after`` rounds and 2 joins; each round's forwards are one flush."""
    rows: list[list[np.ndarray]] = [[] for _ in scripts]
    barriers: list[threading.Barrier] = []

    def wait():
        barriers[0].wait()
        barriers[1].wait()

    live = {}
    for i in (0, 1):
        live[i] = batch.open(wait=wait)
        live[i].reset(scripts[i]["prompt"])
    for round_ in range(2 * len(scripts[0]["steps"])):
        if round_ == leave_after:
            batch.close(live.pop(1))
            live[2] = batch.open(wait=wait)
            live[2].reset(scripts[2]["prompt"])
        active = [i for i in live if len(rows[i]) < len(scripts[i]["steps"])]
        if not active:
            break
        barriers[:] = [threading.Barrier(len(active) + 1) for _ in range(2)]
        threads = [threading.Thread(target=lambda i=i: rows[i].append(play(live[i], scripts[i]["steps"][len(rows[i])])))
                   for i in active]
        for thread in threads:
            thread.start()
        barriers[0].wait()
        batch.flush()
        barriers[1].wait()
        for thread in threads:
            thread.join()
    return rows


def solo_and_batched_rows(open_target, scripts) -> tuple[list, list, LlamaCppBatch]:
    """(each script's rows decoded alone, decoded in a batch of 2 slots, the batch)."""
    solo = []
    for item in scripts:
        adapter = open_target()
        adapter.reset(item["prompt"])
        solo.append([play(adapter, step) for step in item["steps"]])
        adapter.close()
    batch = LlamaCppBatch(open_target(), slots=2)
    together = batched_rows(batch, scripts, leave_after=2)
    assert [len(r) for r in together] == [len(s["steps"]) for s in scripts[:1]] + [2] + [len(scripts[2]["steps"])]
    return solo, together, batch


def largest_difference(solo, together) -> float:
    return max(float(np.abs(a - b).max()) for mine, alone in zip(together, solo) for a, b in zip(mine, alone))


def test_batched_rows_on_the_tiny_gguf_equal_solo_rows_within_batch_variance(gguf_files):
    """F32 weights: llama.cpp's float32 matrix kernels round differently with the batch's size
    (as a tree against its chains, tests/models/test_llamacpp.py), so rows agree to LOGIT_TOLERANCE."""
    scripts = [script(seed, length) for seed, length in zip((1, 2, 3), (9, 23, 5))]
    solo, together, batch = solo_and_batched_rows(lambda: open_adapter(gguf_files["target", VOCAB]), scripts)
    assert largest_difference(solo, together) < LOGIT_TOLERANCE
    assert batch._llama.llama_memory_seq_pos_max(batch._memory, 0) >= 0  # retired cells are kept while sequences live
    for slot in list(batch.open_slots):
        batch.close(slot)
    assert batch._llama.llama_memory_seq_pos_max(batch._memory, 0) == -1  # the last close cleared the cache


@pytest.mark.slow
def test_batched_rows_on_the_default_gguf_are_the_solo_rows_bit_for_bit():
    """The default target (Q4_1, F16 cache, flash attention): its kernels are batch-invariant up
    to 63 tokens, so a batch's rows must be the solo rows exactly; the cell order matters here
    (freeing rejected cells instead of retiring them moves rows by up to ~1.1), and so does where a
    long prompt's prefill is computed (see ``LlamaCppBatch.prefill``)."""
    from verispec.models.llamacpp import gguf_of_target

    path = gguf_of_target("default")
    # prompts of 64 tokens or more prefill through llama.cpp's tiled flash attention, which groups cells by index
    scripts = [script(seed, length, vocab=2000) for seed, length in zip((1, 2, 3), (9, 150, 70))]
    solo, together, _ = solo_and_batched_rows(lambda: LlamaCppAdapter(path, n_threads=1), scripts)
    assert largest_difference(solo, together) == 0.0


def tree_decoder(target, **options) -> SpeculativeDecoder:
    """Greedy token trees that really branch (priced as free)."""
    drafter = TokenTreeDrafter(VOCAB, k=2, max_nodes=8, max_depth=3, cost=FREE_TREES)
    return SpeculativeDecoder(target, drafter, temperature=0, eos_token_id=[], **options)


def test_greedy_batch_on_the_tiny_gguf_equals_solo_with_a_sequence_joining(gguf_files):
    target = LlamaCppAdapter(gguf_files["target", VOCAB], n_threads=1)
    prompts = [[1, 5, 9], [3, 1, 2, 7, 3, 1, 2, 9, 4, 4, 6], [0, 1, 2, 3, 0, 1, 2], [8, 8, 9, 10, 11]]
    limits = [6, 16, 12, 10]
    batched = tree_decoder(target).generate_batch(prompts, max_new_tokens=limits, max_batch=2)
    assert any(step.tree_nodes > 1 for output in batched for step in output.steps)
    for prompt, limit, output in zip(prompts, limits, batched):
        assert output.error is None and len(output.token_ids) == limit
        assert output.token_ids == tree_decoder(target, max_new_tokens=limit).generate(prompt).token_ids


def test_bad_sequences_end_alone_and_the_others_finish(gguf_files):
    target = LlamaCppAdapter(gguf_files["target", VOCAB], n_threads=1)
    prompts = [[1, 5, 9], [], [1, 99], [2] * target.max_context, [4, 5, 6, 7]]
    outputs = tree_decoder(target, max_new_tokens=8).generate_batch(prompts, max_batch=2)
    assert [o.stop_reason for o in outputs] == ["max_new_tokens", "error", "error", "error", "max_new_tokens"]
    assert "empty prompt" in outputs[1].error and f"[0, {VOCAB})" in outputs[2].error
    assert "does not fit the model's context" in outputs[3].error
    for index in (0, 4):
        assert outputs[index].token_ids == tree_decoder(target, max_new_tokens=8).generate(prompts[index]).token_ids


def test_a_full_shared_cache_is_a_clear_error_and_bad_sizes_are_refused(gguf_files):
    target = LlamaCppAdapter(gguf_files["target", VOCAB], n_threads=1)
    batch = LlamaCppBatch(target, slots=2, cells=16)
    slot = batch.open()
    slot.reset([1, 2, 3])
    assert batch.cells == 256  # llama.cpp's smallest cache
    with pytest.raises(ConfigError, match="shared cache of 256 cells is full"):
        for _ in range(40):  # 9 cells a round, one position: retired cells stay until the batch ends
            slot.extend([-1] + [4] * 8, [-1] + [0] * 8)
            slot.commit([], 7)
    assert slot.committed_len < 3 + 40
    with pytest.raises(ConfigError, match="1 to 255 sequences"):
        LlamaCppBatch(target, slots=300)
    with pytest.raises(ConfigError, match="paths must lie"):
        LlamaCppBatch(target, slots=8, paths=40)
    other = batch.open()
    with pytest.raises(ConfigError, match="all 2 sequences"):
        batch.open()
    batch.close(other)


@pytest.mark.slow
def test_batch_law_on_llamacpp_equals_solo_law_and_target_law(gguf_files):
    """Sequence 1 (LAW_PROMPT) of a batch of two, driven by the replay enumerator: its law equals
    its solo law (the rows are the solo rows) and the target's law within the solo test's tolerance."""
    path = gguf_files["target", 4]
    params = SamplingParams(1.0, 2, 1.0)

    def make(adapter):
        return SpeculativeDecoder(adapter, "ngram", method="sd", draft_len=2, top_k=2, max_new_tokens=LAW_TOKENS,
                                  eos_token_id=[])

    target = open_adapter(path)

    def batched(rng):
        outputs = make(target).generate_batch([[3, 1, 2, 0, 3], list(LAW_PROMPT)], rngs=[SeededRng(4), rng])
        assert [o.stop_reason for o in outputs] == ["max_new_tokens"] * 2
        return tuple(outputs[1].token_ids)

    law = enumerate_outcomes(batched, max_leaves=50_000)
    assert len(law) >= 8
    alone = engine_law(path, make, params)  # the solo law, the target's, and the solo test's tolerance 4 N (δ + ε)
    # widened by the batch's own row difference (F32 kernels' batch variance, bounded by
    # LOGIT_TOLERANCE in the row test above)
    tolerance = alone.tolerance + 4 * LAW_TOKENS * LOGIT_TOLERANCE
    assert tolerance < 1e-3  # keeps its power: lossy rules err by 1e-3 .. 1e-2 (tests/engine/test_engine_exact_law.py)
    assert max_abs_difference(law, alone.law) < tolerance
    assert max_abs_difference(law, alone.reference) < tolerance


@pytest.mark.slow
@pytest.mark.parametrize("method", ["ar", "qfree"])
def test_greedy_batch_on_the_default_gguf_equals_solo(default_gguf, method):
    target, prompts, references = default_gguf
    decoder = SpeculativeDecoder(target, None, method=method, temperature=0, max_new_tokens=GREEDY_TOKENS, eos_token_id=[])
    if method == "qfree":
        decoder.drafter.cost = FREE_TREES  # trees that branch
    outputs = decoder.generate_batch(prompts + prompts[:1], max_batch=2)
    assert [o.token_ids for o in outputs] == [r.token_ids for r in references + references[:1]]


def test_a_long_batch_drains_so_its_shared_cache_is_cleared(gguf_files):
    """Retired cells stay until the cache is cleared, which needs every sequence closed: past half
    the cache no sequence joins until the running ones finish. Sixteen prompts two at a time feed
    more than the 256 cells of the tiny model's batch context, and all finish as alone."""
    target = LlamaCppAdapter(gguf_files["target", VOCAB], n_threads=1)
    prompts = [[1 + i % 5, 5, 9, 3 + i % 7] for i in range(16)]
    outputs = tree_decoder(target, max_new_tokens=24).generate_batch(prompts, max_batch=2)
    batch = target.shared_batch
    assert batch.cells == 256 and batch.fed == 0 and not batch.open_slots
    assert sum(len(p) + sum(s.tree_nodes for s in o.steps) for p, o in zip(prompts, outputs)) > batch.cells
    for prompt, output in zip(prompts, outputs):
        assert output.error is None, output.error
        assert output.token_ids == tree_decoder(target, max_new_tokens=24).generate(prompt).token_ids


def test_admission_stops_past_half_the_cache_and_resumes_when_it_is_cleared(gguf_files):
    target = LlamaCppAdapter(gguf_files["target", VOCAB], n_threads=1)
    batch = LlamaCppBatch(target, slots=2)
    slot = batch.open()
    slot.reset([1, 2, 3] * 30)
    assert batch.admits() and batch.fed == 89
    slot.extend([-1] + [4] * 40, [-1] + [0] * 40)
    assert not batch.admits() and batch.fed > batch.cells // 2
    batch.close(slot)
    assert batch.admits() and batch.fed == 0
