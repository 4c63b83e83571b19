"""Mutants of the core layer (src/verispec/core): the draft tree's validation, the lazy row
providers, and the seeded Gumbel noise with each reader of it."""

from __future__ import annotations

from .base import BLOCK, TREE_TESTS, Mutant

ROWS = "core/rows.py"
ROW_KERNELS = "core/logit_kernels.py"
ROWS_TESTS = "tests/core/test_rows.py"
NOISE = "core/noise.py"
QFREE = "verify/qfree.py"
SAMPLERS = "draft/samplers.py"
INVARIANCE_TESTS = "tests/engine/test_drafter_invariance.py"
GUMBEL_TESTS = "tests/verify/test_gumbel.py"

MUTANTS = [
    # the draft tree's validation (core/tree.py)
    Mutant(
        "chain_validation_off",
        "DraftTree.validate accepts a branching tree labelled CHAIN",
        (("core/tree.py", "        self._validate_scheme_structure()\n", "\n"),),
        (TREE_TESTS,),
    ),
    Mutant(
        "iid_paths_validation_off",
        "DraftTree.validate accepts an IID_PATHS tree without (or with non-covering) raw paths",
        (("core/tree.py", "            self._validate_iid_paths(label)\n", "            pass\n"),),
        (TREE_TESTS,),
    ),
    Mutant(
        "distinct_siblings_off",
        "DraftTree.validate accepts repeated sibling tokens in a trie / without-replacement tree",
        (("core/tree.py", "                if len(set(tokens)) != len(tokens):", "                if False:"),),
        (TREE_TESTS,),
    ),

    # the lazy row providers (core.rows, core.logit_kernels): what the engine's rows are made of, and the
    # draws on their supports
    Mutant(
        "support_index_as_token",
        "a draw on the target's support returns the index into the support instead of its token id",
        (("core/rows.py", "    return int(ids[rng.categorical(law)]), int(guard)",
          "    return int(rng.categorical(law)), int(guard)"),),
        (BLOCK,),
    ),
    Mutant(
        "rows_cut_token_entry_dropped",
        "LogitRows entries drop the token that crosses top_p (kept only ties BELOW its id), the support keeps it",
        ((ROWS, "((scaled == s_cut) & (tokens <= id_cut))", "((scaled == s_cut) & (tokens < id_cut))"),),
        (ROWS_TESTS,),
    ),
    Mutant(
        "rows_nucleus_ties_by_higher_id",
        "the nucleus orders tokens tied in p by DEscending id (keeps the highest ids at the cut)",
        ((ROW_KERNELS, "np.arange(len(scaled), dtype=np.int64)\n", "np.arange(len(scaled), dtype=np.int64)[::-1]\n"),),
        (ROWS_TESTS,),
    ),
    Mutant(
        "rows_mass_without_temperature",
        "the top-p mass over V forgets 1/T in the exp2 factor (normaliser of T = 1: wrong cut)",
        ((ROW_KERNELS, "out[i] = float(buffer.mul_(LOG2_E / temperature).exp2_().sum())",
          "out[i] = float(buffer.mul_(LOG2_E).exp2_().sum())"),),
        (ROWS_TESTS,),
    ),
    Mutant(
        "rows_untruncated_mass_float32",
        "the normaliser of an untruncated row accumulated in float32 (off by 1.6e-6 on a long flat tail)",
        ((ROW_KERNELS, "out[i] = float(buffer.div_(temperature).exp_().sum(dtype=torch.float64))",
          "out[i] = float(buffer.div_(temperature).exp_().sum())"),),
        (ROWS_TESTS,),
    ),
    Mutant(
        "rows_top_k_candidates_above_the_cut",
        "top-k candidates found as {logit > l_k}: the k-th token and its ties are lost",
        ((ROWS, "-np.inf if kth == -np.inf else self._threshold_below(kth, shift)", "kth"),),
        (ROWS_TESTS,),
    ),
    Mutant(
        "rows_support_in_probability_order",
        "the nucleus support listed in probability order instead of ascending ids",
        ((ROWS, "kept = np.sort(order[: crossing + 1])", "kept = order[: crossing + 1]"),),
        (ROWS_TESTS,),
    ),
    Mutant(
        "rows_entries_not_truncated",
        "LogitRows entries (probs_of, gather) skip the truncation mask: tokens outside the nucleus get p > 0",
        ((ROWS, "        return np.where(kept, values, 0.0)\n", "        return values\n"),),
        (ROWS_TESTS,),
    ),
    Mutant(
        "rows_greedy_rows_unchecked",
        "greedy rows are not checked: the argmax of a NaN / +inf / all -inf row is used",
        ((ROWS, "        self._check_rows(values, missing)\n", "\n"),),
        (ROWS_TESTS,),
    ),

    # the seeded Gumbel noise (core/noise.py), keyed by absolute position, and its readers: the q-free walk,
    # the decoder's round position, the Gumbel-coupled draft sampler
    Mutant(
        "noise_keyed_by_round_depth",
        "the target's noise is keyed by the depth within the round, not the absolute position (every round reuses G(0), G(1), ...)",
        ((NOISE, "        return gumbel_argmax(rows, node, self.noise, self.position + depth)",
          "        return gumbel_argmax(rows, node, self.noise, depth)"),),
        (INVARIANCE_TESTS, GUMBEL_TESTS),
    ),
    Mutant(
        "walk_position_off_by_one",
        "the seeded q-free walk reads the noise of the next position (depth + 1)",
        ((QFREE, "        token = draws.draw(rows, node, len(visited) - 1)", "        token = draws.draw(rows, node, len(visited))"),),
        (INVARIANCE_TESTS, GUMBEL_TESTS),
    ),
    Mutant(
        "decoder_position_off_by_one",
        "the round's noise starts one position late (committed_len + 2): not the documented absolute position",
        (("engine/decoder.py", "        return NoiseAt(noise, self.target.committed_len + 1)", "        return NoiseAt(noise, self.target.committed_len + 2)"),),
        (INVARIANCE_TESTS,),
    ),
    Mutant(
        "gumbel_draft_position_off_by_one",
        "the Gumbel-coupled draft reads the noise of the next position: still lossless, but the coupling is lost",
        ((SAMPLERS, "gumbel_max(ids, row[ids], draws.noise, draws.position + depth)", "gumbel_max(ids, row[ids], draws.noise, draws.position + depth + 1)"),),
        (GUMBEL_TESTS,),
    ),
    Mutant(
        "top_p_after_the_draw",
        "the Gumbel-max is taken over the row before top-p; a token outside the nucleus is replaced by the argmax",
        ((NOISE, "    ids, probs = rows.support(node)\n    return gumbel_max(ids, probs, noise, position)",
          "    ids, probs = rows.support(node)\n"
          "    import dataclasses\n"
          "    untruncated = type(rows)(rows.logits, dataclasses.replace(rows.params, top_p=1.0))\n"
          "    token = gumbel_max(*untruncated.support(node), noise, position)\n"
          "    return token if token in set(ids[probs > 0].tolist()) else rows.argmax(node)"),),
        (INVARIANCE_TESTS,),
    ),
]
