"""Mutants of the model backends (src/verispec/models): llama.cpp batches, the batch runner and the
padded head step, and the shaped rows of batch invariance."""

from __future__ import annotations

from .base import BATCH_DRAFT_TESTS, Mutant

LLAMACPP_BATCH = "models/llamacpp_batch.py"
LLAMACPP_BATCH_TESTS = "tests/models/test_llamacpp_batch.py"
ROW_SHAPE = "models/row_shape.py"
NATIVE = "models/native_llama.py"
ROW_SHAPE_TESTS = "tests/models/test_row_shape.py"
BATCH_INVARIANT_TESTS = "tests/engine/test_batch_invariant.py"
BATCH_RUNNER = "models/batch_runner.py"
BATCH_RUNNER_TESTS = "tests/models/test_batch_runner.py"

MUTANTS = [
    # llama.cpp batches (models/llamacpp_batch.py)
    Mutant(
        "llamacpp_batch_frees_cells",
        "a llama.cpp batch frees rejected cells as a solo adapter does: holes refilled out of position order",
        ((LLAMACPP_BATCH, "        self._llama.llama_memory_seq_cp(self._memory, seq, GARBAGE_SEQ, position, -1)\n", ""),),
        (LLAMACPP_BATCH_TESTS + "::test_batched_rows_on_the_default_gguf_are_the_solo_rows_bit_for_bit",),
    ),
    Mutant(
        "llamacpp_batch_rows_misrouted",
        "a llama.cpp batch joins the sequences' entries in one order and hands the rows back in another",
        ((LLAMACPP_BATCH, "        for slot in order:\n            for name in", "        for slot in reversed(order):\n            for name in"),),
        (LLAMACPP_BATCH_TESTS,),
    ),
    Mutant(
        "llamacpp_batch_ids_overlap",
        "the sequence-id ranges of a llama.cpp batch's slots overlap (a sequence reads another's cells)",
        ((LLAMACPP_BATCH, "        return 1 + slot * self.paths + seq", "        return 1 + slot + seq"),),
        (LLAMACPP_BATCH_TESTS,),
    ),
    Mutant(
        "llamacpp_batch_prefill_in_place",
        "a llama.cpp batch prefills a prompt in the shared cache, where its cells do not start at cell 0",
        ((LLAMACPP_BATCH, "            self.batch.prefill(self.batch.global_id(self.index, 0), prompt)\n",
          "            body = prompt[:-1]\n            self.batch.decode(_Submission(body, list(range(len(body))), "
          "self._global([(0,)] * len(body)), [False] * len(body)), self.prefill_batch)\n"),),
        (LLAMACPP_BATCH_TESTS + "::test_batched_rows_on_the_default_gguf_are_the_solo_rows_bit_for_bit",),
    ),
    Mutant(
        "llamacpp_batch_never_drains",
        "a llama.cpp batch admits new sequences whatever its cache holds: retired cells pile up until forwards fail",
        ((LLAMACPP_BATCH, "        return self.fed <= self.cells // 2", "        return True"),),
        (LLAMACPP_BATCH_TESTS + "::test_a_long_batch_drains_so_its_shared_cache_is_cleared",),
    ),

    # the batch runner (models/batch_runner.py) and the padded head step (models/head_batch.py)
    Mutant(
        "batch_features_of_the_first_sequence",
        "every slot of a batched forward gets the first request's rows of the target's hidden states (a head drafts from another sequence's features)",
        (("models/batch_runner.py", "torch.cat([captured[i][packed : packed + n] for i in request.features], dim=-1)",
          "torch.cat([captured[i][:n] for i in request.features], dim=-1)"),),
        (BATCH_DRAFT_TESTS,),
    ),
    Mutant(
        "batch_head_new_columns_misplaced",
        "the padded head step puts a sequence's new entries at its own past length instead of after the longest past (it attends padding)",
        (("models/head_batch.py", "            allowed[row, :n, past : past + n] = own[:, m:]", "            allowed[row, :n, m : m + n] = own[:, m:]"),),
        (BATCH_DRAFT_TESTS,),
    ),
    Mutant(
        "batch_head_rows_of_the_first_sequence",
        "every sequence gets the first sequence's output of the padded head step",
        (("models/head_batch.py", "StepOutput(result.out[row : row + 1, :n]", "StepOutput(result.out[0:1, :n]"),),
        (BATCH_DRAFT_TESTS,),
    ),
    Mutant(
        "batch_whole_keys_from_slot_zero",
        "the attention over the slots' whole key buffers reads slots [0, B) whatever slots submitted (a forward of slots 1 and 2 sees slot 0's keys)",
        ((BATCH_RUNNER, "keys, values = key_cache[slots[0] : slots[0] + batch], value_cache[slots[0] : slots[0] + batch]",
          "keys, values = key_cache[:batch], value_cache[:batch]"),),
        (BATCH_RUNNER_TESTS,),
    ),
    Mutant(
        "batch_mask_of_the_first_slot_length",
        "every request's mask is placed at the first submitted slot's cache length (a slot sees another's key length)",
        ((BATCH_RUNNER, "                allowed = self._allowed(slot, request)\n",
          "                allowed = self._allowed(slots[0], request)\n"),),
        (BATCH_RUNNER_TESTS,),
    ),
    Mutant(
        "batch_queries_heads_swapped",
        "same-size requests lay their queries out group-major instead of kv-head-major (query heads read the wrong kv head)",
        ((BATCH_RUNNER, "q.view(batch, width, kv_heads, group, head_dim).permute(0, 2, 3, 1, 4)",
          "q.view(batch, width, group, kv_heads, head_dim).permute(0, 3, 2, 1, 4)"),),
        (BATCH_RUNNER_TESTS,),
    ),
    Mutant(
        "batch_padded_output_rows_shifted",
        "requests of different sizes read their attention output one row off (the last input reads a padded row)",
        ((BATCH_RUNNER, "out = out[rows, :, :, offsets].reshape(total, heads * head_dim)",
          "out = out[rows, :, :, (offsets + 1) % width].reshape(total, heads * head_dim)"),),
        (BATCH_RUNNER_TESTS,),
    ),
    Mutant(
        "batch_values_from_the_key_columns",
        "the stacked q|k|v product's values are read from the key columns (unrotated keys as values)",
        ((BATCH_RUNNER, "qk[:, :heads], qk[:, heads:], qkv[:, heads + kv_heads :]", "qk[:, :heads], qk[:, heads:], qkv[:, heads : heads + kv_heads]"),),
        (BATCH_RUNNER_TESTS,),
    ),
    Mutant(
        "batch_gate_and_up_swapped",
        "the stacked gate|up product's halves are taken the other way round (SiLU of the up projection)",
        ((BATCH_RUNNER, "gate, up = gate_up_proj(x).chunk(2, dim=-1)", "up, gate = gate_up_proj(x).chunk(2, dim=-1)"),),
        (BATCH_RUNNER_TESTS,),
    ),

    # batch invariance: rows shaped so a row's kernels do not depend on the batch (models/row_shape.py,
    # native_llama.py, engine/invariance.py)
    Mutant(
        "invariance_off",
        "batch_invariant / enable_batch_invariance leaves the runner unshaped (bf16 seeded texts then differ from ar's here)",
        (("engine/invariance.py", "invariant_row_shape(runner, target.vocab_size) if shape is None else shape",
          "invariant_row_shape(runner, target.vocab_size) if shape is None else None"),),
        (BATCH_INVARIANT_TESTS + "::test_seeded_texts_equal_plain_sampling_with_the_mode_in_bf16",),
    ),
    Mutant(
        "rows_unpadded",
        "chunks are not padded to min_rows: a plain step runs the one-row kernels",
        ((ROW_SHAPE, "        return max(num_rows, self.min_rows)", "        return num_rows"),),
        (ROW_SHAPE_TESTS,),
    ),
    Mutant(
        "row_keys_unmasked",
        "each row attends to every entry of the chunk's cache, not only its visible ones (no tree/causal mask)",
        ((NATIVE, "        visible = allowed[row].nonzero().flatten()", "        visible = torch.arange(allowed.shape[1])"),),
        (ROW_SHAPE_TESTS + "::test_shaped_forward_computes_the_same_function",),
    ),
    Mutant(
        "dummy_rows_kept",
        "the cache length ends after the dummy rows (they stay visible to later forwards)",
        ((NATIVE, "            self.length = start + real  #", "            self.length = start + rows  #"),),
        (ROW_SHAPE_TESTS + "::test_shaped_forward_computes_the_same_function",),
    ),
    Mutant(
        "logits_of_dummy_rows",
        "a padded chunk returns the logits of its last rows (dummies) instead of its real rows",
        ((NATIVE, "[real - kept : real]", "[rows - kept : rows]"),),
        (ROW_SHAPE_TESTS + "::test_shaped_forward_computes_the_same_function",),
    ),
    Mutant(
        "probe_without_trees",
        "the probe checks chains only (trees put a path's keys apart in the cache: not invariant in fp32 here)",
        ((ROW_SHAPE, "    tree_sizes = [size for size in sizes if size > 1]", "    tree_sizes = []"),),
        (ROW_SHAPE_TESTS,),
    ),
    Mutant(
        "padding_keys_not_zeroed",
        "the masked keys past the cache length are not zeroed (a stale NaN there turns every row NaN: 0 * NaN)",
        ((NATIVE, "            if key_end > end:\n", "            if False:\n"),),
        (ROW_SHAPE_TESTS + "::test_masked_padding_keys_are_zeroed_so_stale_nan_cannot_leak",),
    ),
    Mutant(
        "chunks_uncapped",
        "a forward longer than max_rows runs in one piece (its rows leave the invariant kernel class)",
        ((ROW_SHAPE, "        return [(a, min(a + self.max_rows, num_rows)) for a in range(0, num_rows, self.max_rows)]",
          "        return [(0, num_rows)] if num_rows else []"),),
        (ROW_SHAPE_TESTS,),
    ),
]
