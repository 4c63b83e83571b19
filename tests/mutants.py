"""Mutation check of the exactness suite: apply plausible one-line bugs to a temporary
copy of ``src/`` and run the tests that must catch them. Every mutant must be caught.

    PYTHONPATH=src OMP_NUM_THREADS=1 python tests/mutants.py            # all mutants
    PYTHONPATH=src OMP_NUM_THREADS=1 python tests/mutants.py tie_select  # by name
    python tests/mutants.py --list

Each mutant is a list of exact text substitutions (each must match exactly once, or the mutant
is reported NOT APPLIED: the source moved and the mutant needs updating) and the test files to
run. Prints a table: mutant -> caught or SURVIVED, the first failing tests, seconds. Exit status
1 if any mutant survived or could not be applied. Not collected by pytest (no ``test_`` prefix).

Equivalent mutants left out on purpose: where q(x) = 0 sits in the local order (ratio 0 instead of
+inf) never changes the law, since such tokens carry no draft mass and are never drafted.
Traversal's zeroing of the removed tokens in Q_u on the support (verify/traversal.py, ``q_now[...]
= 0``) is equivalent too: a child x is rejected only with a_u P_u(x) < Q_u(x), so the update sets
P_u(x) = 0 and every later surplus at x is [0 - Q_u(x)]_+ = 0 whatever Q_u(x) holds. The
root-alone shortcut's bound written as a ratio, (1 + k a) / cost(k) < 1 / cost(1), is the gain
form 1 + k a - cost(k) / cost(1) < 0 multiplied by cost(k) > 0: the same inequality.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGE = "src/verispec"

GREEDY = "verify/greedy_selection.py"
BLOCK = "tests/verify/test_block_rules.py"
GREEDY_TESTS = "tests/verify/test_greedy_selection.py"
FAST_BELOW_TESTS = "tests/verify/test_below_mass_fast.py"
BRANCHING = "tests/verify/test_branching_roots.py"
ACCEPTANCE_PRIOR = "tests/engine/test_acceptance_prior.py"
EDGES = "tests/verify/test_edge_cases.py"
TREE_TESTS = "tests/core/test_tree.py"
ROWS = "core/rows.py"
ROW_KERNELS = "core/logit_kernels.py"
ROWS_TESTS = "tests/core/test_rows.py"
BATCH_DRAFT_TESTS = "tests/engine/test_batch_draft_model.py"
LLAMACPP_BATCH = "models/llamacpp_batch.py"
LLAMACPP_BATCH_TESTS = "tests/models/test_llamacpp_batch.py"


@dataclass(frozen=True)
class Mutant:
    name: str
    description: str
    edits: tuple[tuple[str, str, str], ...]  # (file under src/verispec, old text, new text)
    tests: tuple[str, ...]


MUTANTS = [
    Mutant(
        "tie_select",
        "GMPBV/★ selection breaks p/q ties by the HIGHER id ranking lower (selection only)",
        ((GREEDY, "key=lambda i: order_key(ratios, i, int(tokens[i])))",
          "key=lambda i: (float(ratios[i]), -int(tokens[i])))"),),
        (GREEDY_TESTS,),
    ),
    Mutant(
        "tie_law",
        "skewed law (C(z), modification) breaks ties the other way (law only)",
        ((GREEDY, "mask[:token] |= ratios[:token] == ratio", "mask[token + 1:] |= ratios[token + 1:] == ratio"),
         (GREEDY, "return np.lexsort((token_ids, ratios))", "return np.lexsort((-np.asarray(token_ids), ratios))")),
        (GREEDY_TESTS,),
    ),
    Mutant(
        "tie_law_fast_path",
        "below_mass_all's packed sort key breaks exact ties by the HIGHER id ranking lower",
        ((GREEDY, "keys |= np.arange(count, dtype=np.int64)", "keys |= np.arange(count, dtype=np.int64)[::-1]"),),
        (GREEDY_TESTS, FAST_BELOW_TESTS),
    ),
    Mutant(
        "fast_path_no_repair",
        "below_mass_all trusts its packed (truncated ratio, id) keys: near ties left out of order",
        ((GREEDY, "if not np.all(ranked[1:] >= ranked[:-1]):", "if False:"),),
        (GREEDY_TESTS, FAST_BELOW_TESTS),
    ),
    Mutant(
        "fast_path_unstable_repair",
        "below_mass_all repairs near ties with an unstable sort (exact ties lose their id order)",
        ((GREEDY, 'order = order[np.argsort(ranked, kind="stable")]', "order = order[np.argsort(ranked)]"),),
        (GREEDY_TESTS, FAST_BELOW_TESTS),
    ),
    Mutant(
        "fast_path_key_bits",
        "below_mass_all packs the id into one bit too few (ids collide with ratio bits)",
        ((GREEDY, "index_bits = max(count - 1, 0).bit_length()", "index_bits = max(count - 1, 0).bit_length() - 1"),),
        (GREEDY_TESTS, FAST_BELOW_TESTS),
    ),
    Mutant(
        "fast_path_dense_inclusive",
        "below_mass_all's untruncated-row path counts each token's own q in its below-mass",
        ((GREEDY, "        below[ranked] = np.cumsum(ranked_mass) - ranked_mass\n        return below",
          "        below[ranked] = np.cumsum(ranked_mass)\n        return below"),),
        (GREEDY_TESTS, FAST_BELOW_TESTS),
    ),
    Mutant(
        "qtilde_self_normalised",
        "q̃ rows normalised by their own sum and C(z) missing from the rows (vacuous Σ q̃ = 1)",
        ((GREEDY, "lower = self.below[position] + self.mass[position] * below_mass_all(target, draft)",
          "lower = self.mass[position] * below_mass_all(target, draft)"),
         (GREEDY, "self._rows[position] = row / (scale if scale > 0.0 else row.sum())",
          "self._rows[position] = row / row.sum()")),
        (GREEDY_TESTS,),
    ),
    Mutant(
        "wrong_C",
        "C(z) accumulates q(y) without the factor Q(z)",
        ((GREEDY, "self.below[i + 1] = self.below[i] + self.mass[i] * below_token",
          "self.below[i + 1] = self.below[i] + below_token"),),
        (GREEDY_TESTS,),
    ),
    Mutant(
        "qtilde_gather_without_C",
        "q̃ entries read on the target's support miss C(z), the mass of the paths ranked below",
        ((GREEDY, "lower = self.below[position] + self.mass[position] * below_mass_on_supports(",
          "lower = self.mass[position] * below_mass_on_supports("),),
        (GREEDY_TESTS,),
    ),
    Mutant(
        "support_bottom_block_dropped",
        "the support form of the below masses forgets the p = 0 tokens (ratio 0) ranked lowest",
        ((GREEDY, "    bottom = float(bottom_cumulative[-1]) if len(bottom_cumulative) else 0.0",
          "    bottom = 0.0"),),
        (GREEDY_TESTS, FAST_BELOW_TESTS),
    ),
    Mutant(
        "gbv_residual_unscaled",
        "GBV-mod/★ residual norm([p - q]_+) instead of norm([nu p - q]_+) (the support-coordinates builder)",
        (("verify/gbv_mod.py", "draw_on_support(rng, tree.target, node, greedy_block_residual(draft_rows, tau, log_nu))",
          "draw_on_support(rng, tree.target, node, greedy_block_residual(draft_rows, tau, 0.0))"),),
        (BLOCK,),
    ),
    Mutant(
        "gbv_surplus_signed",
        "GBV-mod/★ S_i summed without the positive part",
        (("verify/gbv_mod.py", "surplus = float(np.maximum(difference, 0.0, out=difference).sum())",
          "surplus = float(difference.sum())"),),
        (BLOCK,),
    ),
    Mutant(
        "k1_fallback",
        "IID_PATHS tree without raw paths silently verified with K = 1",
        ((GREEDY, "        if tree.num_paths < 1:\n            raise InvalidDraftError(",
          "        if tree.num_paths < 1:\n            return 1\n            raise InvalidDraftError("),),
        (TREE_TESTS, "tests/verify/test_scheme_errors.py"),
    ),
    Mutant(
        "bv_residual_w1",
        "BV residual norm([p - q]_+) instead of norm([w p - q]_+)",
        (("verify/bv.py", "lambda ids, p: residual(p, row_gather(draft_rows, tau, ids), target_scale=w)",
          "lambda ids, p: residual(p, row_gather(draft_rows, tau, ids))"),),
        (BLOCK,),
    ),
    Mutant(
        "sd_residual_swapped",
        "SD residual norm([q - p]_+)",
        (("verify/sd.py", "residual(p, tree.draft.gather(parent, ids))",
          "residual(tree.draft.gather(parent, ids), p)"),),
        (BLOCK,),
    ),
    Mutant(
        "support_index_as_token",
        "a draw on the target's support returns the index into the support instead of its token id",
        (("core/rows.py", "    return int(ids[rng.categorical(law)]), int(guard)",
          "    return int(rng.categorical(law)), int(guard)"),),
        (BLOCK,),
    ),
    Mutant(
        "rrs_dedup",
        "RRS runs its with-replacement formulas on the deduplicated trie children",
        (("verify/rrs.py", "raw = tree.scheme in (DraftScheme.CHAIN, DraftScheme.IID_PATHS)", "raw = False"),),
        ("tests/verify/test_rrs.py", BRANCHING),
    ),
    Mutant(
        "spectr_rho_wrong_side",
        "SpecTr K-SEQ with rho from the f < 0 side and the root-form residual",
        (("verify/spectr.py", "        return kseq_node(rng, target, draft, node, tokens)\n",
          "        return kseq_node(rng, target, draft, node, tokens, lambda t, d, k: kseq_rho_bracket(t, d, k, 2)[0], root_form_residual)\n"),),
        ("tests/verify/test_spectr.py", BRANCHING),
    ),
    Mutant(
        "traversal_no_q_update",
        "traversal skips the Q_u update on scheme (a) trees",
        (("verify/traversal.py", "            if update_draft:", "            if False:"),),
        (BLOCK, BRANCHING),
    ),
    Mutant(
        "gbv_mod_no_modification",
        "GBV-mod leaves no modification window",
        (("verify/gbv_mod.py", "if self.modify_target and remaining > 0:", "if False:"),),
        (BLOCK, EDGES),
    ),
    Mutant(
        "star_no_modification",
        "SpecTr-GBV★ leaves no modification window",
        (("verify/spectr_gbv_star.py", "        if remaining > 0:\n", "        if False:\n"),),
        (BLOCK, GREEDY_TESTS),
    ),
    Mutant(
        "star_window_unscaled",
        "SkewedDraftJoint.advance rescales C and Q but forgets the scale",
        (("verify/modification.py", "self.num_drafts, self.log_scale + math.log(scale))",
          "self.num_drafts, self.log_scale)"),),
        (BLOCK, GREEDY_TESTS),
    ),
    Mutant(
        "window_sign",
        "modification divides the draft joint by 1/P(z) instead of P(z)",
        (("verify/modification.py", "scaled_to_linear(vector, log_scale - self.log_target_joint)",
          "scaled_to_linear(vector, log_scale + self.log_target_joint)"),),
        (BLOCK,),
    ),
    Mutant(
        "window_linear_exp",
        "modification forms exp(log Qd - log P) in linear space (overflows once log P < -709.8)",
        (("verify/modification.py", "    if abs(log_factor) <= _LINEAR_LOG_RANGE:\n", "    if True:\n"),),
        ("tests/verify/test_modification.py",),
    ),
    Mutant(
        "window_old_exp",
        "the pre-fix code: Qd(z, .) and 1/P(z) formed separately (exp(-log P) overflows at log P = -800)",
        (("verify/modification.py", "draft_joint = scaled_to_linear(vector, log_scale - self.log_target_joint)",
          "draft_joint = vector * math.exp(log_scale) * math.exp(-self.log_target_joint)"),),
        ("tests/verify/test_modification.py",),
    ),
    Mutant(
        "gmpbv_plain_q",
        "GMPBV runs BV with the plain draft q instead of q̃",
        (("verify/gmpbv.py", "block_verify_draw(rng, tree, rows, law, tokens, law.token_probs)",
          "block_verify_draw(rng, tree, rows, draft_rows, tokens)"),),
        (BLOCK,),
    ),
    Mutant(
        "rrsw_no_draft_update",
        "RRSw keeps the with-replacement draft after a rejection",
        (("verify/rrs.py", "return _recursive_rejection(rng, target, draft, tokens, without_replacement=True, node=node)",
          "return _recursive_rejection(rng, target, draft, tokens, without_replacement=False, node=node)"),),
        ("tests/verify/test_rrs.py", BRANCHING),
    ),
    Mutant(
        "chain_validation_off",
        "DraftTree.validate accepts a branching tree labelled CHAIN",
        (("core/tree.py", "        self._validate_scheme_structure()\n", "\n"),),
        (TREE_TESTS,),
    ),
]


MUTANTS += [
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
]


# the lazy row providers (core.rows, core.logit_kernels): what the engine's rows are made of
MUTANTS += [
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
]


# the chain and path rules read rows on the target's support (bv, nss / qfree, spectr)
MUTANTS += [
    Mutant(
        "bv_ratios_one_block_short",
        "BV stops reading the ratios p_i(x_i)/q_i(x_i) one block too early (the last positions get h = 0)",
        (("verify/bv.py", "    while start < length:\n        stop = min(start + block, length)",
          "    while start + block < length:\n        stop = min(start + block, length)"),),
        (BLOCK,),
    ),
    Mutant(
        "bv_rho_on_draft_support",
        "BV sums rho_i = sum [w p - q]_+ over the draft's support instead of the target's",
        (("verify/bv.py", "        ids, p = tree.target.support(rows[i])\n",
          "        ids = tree.draft.support(rows[i])[0]\n        p = tree.target.gather(rows[i], ids)\n"),),
        (BLOCK,),
    ),
    Mutant(
        "gmpbv_rho_on_draft_support",
        "GMPBV sums rho_i over the support of q̃ (its rows) instead of the target's",
        (("verify/bv.py", "        ids, p = tree.target.support(rows[i])\n",
          "        from verispec.verify.path_rows import row_support\n"
          "        ids = row_support(draft_rows, i)[0]\n        p = tree.target.gather(rows[i], ids)\n"),),
        (BLOCK, GREEDY_TESTS),
    ),
    Mutant(
        "nss_miss_law_token_as_index",
        "NSS / q-free miss law zeroes the child TOKEN IDS as positions of the support (the dense code, ported as is)",
        (("verify/qfree.py", "    rest[np.isin(ids, child_tokens)] = 0.0\n",
          "    rest[child_tokens] = 0.0\n"),),
        ("tests/verify/test_nss.py", "tests/verify/test_qfree.py"),
    ),
    Mutant(
        "qfree_hits_from_child_rows",
        "the q-free walk gathers the children's probabilities from the children's rows instead of the node's",
        (("verify/qfree.py", "hit = rows.probs_of([node] * len(tokens), tokens)",
          "hit = rows.probs_of(list(child_of.values()), tokens)"),),
        ("tests/verify/test_qfree.py",),
    ),
    Mutant(
        "spectr_rho_on_draft_support",
        "SpecTr finds rho on the draft's support (D(rho) misses p where q = 0)",
        (("verify/spectr.py", "        ids, p = target.support(node)\n        return rho_fn(p, draft.gather(node, ids), k)",
          "        ids = draft.support(node)[0]\n        return rho_fn(target.gather(node, ids), draft.gather(node, ids), k)"),),
        ("tests/verify/test_spectr.py",),
    ),
]


# the tree rules on the target's support (verify/support.py, rrs.py, spechub.py, traversal.py)
SUPPORT_TESTS = "tests/verify/test_support.py"
MUTANTS += [
    Mutant(
        "rrsw_normaliser_on_support",
        "RRSw renormalises d_j over the target's support only (drops the draft mass outside it)",
        (("verify/rrs.py", "    d_support = q_support / left\n",
          "    d_support = q_support / (q_support.sum() - q_support[positions_of(ids, removed)].sum())\n"),),
        ("tests/verify/test_rrs.py", BRANCHING),
    ),
    Mutant(
        "rrs_residual_on_draft_support",
        "RRS builds t_j on the draft's support instead of the target's",
        (("verify/rrs.py", "ids, p_support = target.support(node)",
          "ids = np.flatnonzero(draft.gather(node, np.arange(draft.vocab_size)) > 0); p_support = target.gather(node, ids)"),),
        ("tests/verify/test_rrs.py", BRANCHING),
    ),
    Mutant(
        "rrs_stale_target_entry",
        "RRS tests later candidates against p(c) instead of the updated t_j(c)",
        (("verify/rrs.py", "t_c = target.prob(node, token) if t is None else value_at(ids, t, token)",
          "t_c = target.prob(node, token)"),),
        ("tests/verify/test_rrs.py", BRANCHING),
    ),
    Mutant(
        "spechub_r2_on_support",
        "SpecHub's R2 sums q - pi1 over the target's support only (drops the draft mass outside it)",
        (("verify/spechub.py", "return (1.0 - hub_mass) - (",
          "return (float(draft.sum()) - (float(draft[hub_at]) if hub_at is not None else 0.0)) - ("),),
        ("tests/verify/test_spechub.py", BRANCHING),
    ),
    Mutant(
        "spechub_hub_residual_kept",
        "SpecHub's residual on the support keeps r(a) = [p(a) - (1 + c) q(a)]_+ instead of p(a) - A1 - A2",
        (("verify/spechub.py", "    if hub_at is not None:  # a outside S", "    if False:  # a outside S"),),
        ("tests/verify/test_spechub.py", BRANCHING),
    ),
    Mutant(
        "traversal_draw_from_p",
        "traversal draws y from p(.|v) instead of the updated P_v after rejections below v",
        (("verify/traversal.py", "            mutated = target.get(node)\n            if mutated is None:",
          "            mutated = None\n            if mutated is None:"),),
        (BLOCK, BRANCHING),
    ),
    Mutant(
        "traversal_stale_target_entry",
        "traversal weighs children with p(c|u) instead of the updated P_u(c)",
        (("verify/traversal.py", "return value_at(support[node][0], mutated, token) if mutated is not None else",
          "return target_rows.prob(node, token) if mutated is not None else"),),
        (BLOCK, BRANCHING),
    ),
    Mutant(
        "traversal_unscaled_draft",
        "traversal's surplus uses q instead of the renormalised Q_u on the support",
        (("verify/traversal.py", "q_now = q_support * draft_scale.get(parent, 1.0)", "q_now = q_support.copy()"),),
        (BLOCK, BRANCHING),
    ),
    Mutant(
        "support_not_realigned",
        "a law kept over one support is drawn over another support of the row without realigning",
        (("verify/support.py", "if ids is law_ids or (len(ids) == len(law_ids) and np.array_equal(ids, law_ids)):",
          "if True:"),),
        (SUPPORT_TESTS,),
    ),
]

# replay of real drafts and the per-chain expectations of the claims table (verispec compare)
REPLAY = "bench/replay.py"
COMPARE_REPLAYING = "bench/compare/replaying.py"
REPLAY_TESTS = "tests/bench/test_replay_modification.py"
COMPARE_TESTS = "tests/bench/test_compare.py"
MUTANTS += [
    Mutant(
        "replay_modified_rows_for_every_rule",
        "every rule replays the rows as verified (the live rule's windows applied to rules without windows)",
        ((REPLAY, "    if not modified_rows and tree.unmodified_target is not None:", "    if False:"),),
        (REPLAY_TESTS,),
    ),
    Mutant(
        "replay_unmodified_rows_for_every_rule",
        "the modifying rule replays the model's rows too: its live windows are dropped (overstates GBV-mod)",
        ((REPLAY, "    if not modified_rows and tree.unmodified_target is not None:", "    if tree.unmodified_target is not None:"),),
        (REPLAY_TESTS,),
    ),
    Mutant(
        "replay_modifying_rule_on_foreign_recording",
        "a modifying rule is replayed on a recording another live rule made (windows it never left)",
        ((REPLAY, "    if modified_rows and not same_modification(method, live):", "    if False:"),),
        (REPLAY_TESTS,),
    ),
    Mutant(
        "compare_sd_expectation_without_product",
        "SD's E[BE given the chain] sums the per-position acceptances instead of their running product",
        ((COMPARE_REPLAYING, "return 1.0 + float(np.cumprod(np.minimum(1.0, p / q)).sum())", "return 1.0 + float(np.minimum(1.0, p / q).sum())"),),
        (COMPARE_TESTS,),
    ),
    Mutant(
        "compare_bv_expectation_counts_w0",
        "BV's E[BE given the chain] counts w_0 = 1 as an accepted token",
        ((COMPARE_REPLAYING, "return 1.0 + float(capped_weights(p, q)[1:].sum())", "return 1.0 + float(capped_weights(p, q).sum())"),),
        (COMPARE_TESTS,),
    ),
    Mutant(
        "compare_chain_view_reads_path_one",
        "the chain view hands chain rules the last path instead of path 0 (a path other rules' CRN do not share)",
        ((REPLAY, "    nodes = np.array([0, *tree.paths[0]], dtype=np.int64)", "    nodes = np.array([0, *tree.paths[-1]], dtype=np.int64)"),),
        (REPLAY_TESTS,),
    ),
]

NOISE = "core/noise.py"
QFREE = "verify/qfree.py"
SAMPLERS = "draft/samplers.py"
INVARIANCE_TESTS = "tests/engine/test_drafter_invariance.py"
GUMBEL_TESTS = "tests/verify/test_gumbel.py"
MUTANTS += [
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
        "batch_budget_costs_one_sequence",
        "the batch budget prices each tree as if its sequence were alone (cost of 1 + nodes, not of the whole forward)",
        (("engine/batch_budget.py", "    base = fixed_tokens + batch  # the roots", "    base = 1  # the roots"),),
        ("tests/engine/test_batch_budget.py",),
    ),
    Mutant(
        "batch_budget_ignores_queued_tokens",
        "the batch budget leaves out the tokens other sequences already queued for the same forward",
        (("engine/batch_budget.py", "    base = fixed_tokens + batch  # the roots", "    base = batch  # the roots"),),
        ("tests/engine/test_batch_budget.py",),
    ),
    Mutant(
        "batch_share_ignored",
        "a sequence of a batch scores all it grew of its tree instead of the share the batch budget gave it",
        (("engine/drafters.py", "            return replace(order.tree().prefix(nodes), plan=plan)", "            return replace(order.tree(), plan=plan)"),),
        ("tests/engine/test_batch_engine.py::test_the_batch_budget_sizes_trees_and_chains_and_its_decision_is_in_the_stats",),
    ),
    Mutant(
        "batch_budget_worst_first",
        "the batch budget merges the offers worst first (kept nodes are no longer the most promising)",
        (("engine/batch_budget.py", "key=lambda score: -score)", "key=lambda score: score)"),),
        ("tests/engine/test_batch_budget.py",),
    ),
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
    Mutant(
        "batch_draft_rows_rotated",
        "the batched draft forward hands each sequence the next sequence's rows (still exact in law: only the seeded solo comparison sees it)",
        (("engine/batch.py", "                turns = drafting\n",
          "                rows = self.draft_runner._results; order = sorted(rows)\n"
          "                self.draft_runner._results = dict(zip(order, [rows[s] for s in order[1:] + order[:1]]))\n"
          "                turns = drafting\n"),),
        (BATCH_DRAFT_TESTS + "::test_seeded_batch_with_a_draft_model_equals_each_prompt_alone",),
    ),
    Mutant(
        "batch_draft_unbatched",
        "each sequence's draft model runs on its own solo runner: same tokens, but no batched draft forward",
        (("engine/batch.py", "        return HFModelAdapter(self._draft_base.model, runner=seq.draft_slot)",
          "        return HFModelAdapter(self._draft_base.model)"),),
        (BATCH_DRAFT_TESTS,),
    ),
    Mutant(
        "batch_draft_waits_at_the_target",
        "a sequence paused at its draft forward is taken as waiting on the target (its draft forward never runs)",
        (("engine/batch.py", 'self._pause(seq, "draft")', 'self._pause(seq, "target")'),),
        (BATCH_DRAFT_TESTS,),
    ),
    Mutant(
        "batch_draft_slot_leak",
        "a finished sequence keeps its draft slot (the draft cache grows with every sequence)",
        (("engine/batch.py", "            self.draft_runner.close(seq.draft_slot)\n", "            pass\n"),),
        (BATCH_DRAFT_TESTS,),
    ),
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
        "batch_overhead_without_drafts",
        "the batch cost model learns no overhead (the batched draft forwards before the target forward go unpriced)",
        (("engine/batch.py", "self.decoder.batch_cost_model.record(scored, end - tic, tic - round_start)",
          "self.decoder.batch_cost_model.record(scored, end - tic, 0.0)"),),
        (BATCH_DRAFT_TESTS + "::test_the_batch_budget_prices_the_draft_forwards_in_the_round",),
    ),
    Mutant(
        "probe_ignores_its_cost",
        "probes come every + 1 rounds apart whatever a probe costs (where forwards cost linearly they take a fifth of the time)",
        (("draft/tree_policy.py", "        return max(self.every, math.ceil(extra / self.max_overhead) - 1)", "        return self.every"),),
        ("tests/engine/test_cost_model.py",),
    ),
    Mutant(
        "cost_pseudo_readings_at_the_prior",
        "a bucket's pseudo-readings sit at the prior (zeros) instead of the ratio pooled over the other sizes",
        (("engine/cost_model.py", "        pseudo = [pooled] * self.prior_weight", "        pseudo = [0.0] * self.prior_weight"),),
        ("tests/engine/test_cost_model.py",),
    ),
    Mutant(
        "cost_prior_ignored",
        "the decoder ignores its target's cost prior (llama.cpp's first rounds are sized as if extra tokens were free)",
        (("engine/decoder.py", '        prior = getattr(self.target, "cost_prior", None)', "        prior = None"),),
        ("tests/engine/test_cost_model.py",),
    ),
    Mutant(
        "shadow_always_hits",
        "a root-only round's shadow trials count every root candidate as accepted (the estimates grow optimistic)",
        (("engine/drafters.py", "(c.cls, c.token == int(next_token))", "(c.cls, True)"),),
        (ACCEPTANCE_PRIOR,),
    ),
    Mutant(
        "acceptance_prior_unscaled",
        "the acceptance estimates ignore prior_scale (llama.cpp's fresh decoders draft from the optimistic prior)",
        (("draft/tree_policy.py", "self.prior_weight * self.prior_scale * self.prior(cls)", "self.prior_weight * self.prior(cls)"),),
        (ACCEPTANCE_PRIOR,),
    ),
    Mutant(
        "acceptance_prior_ignored",
        "the decoder ignores its target's acceptance_prior_scale",
        (("engine/decoder.py", 'prior_scale=getattr(self.target, "acceptance_prior_scale", 1.0)', "prior_scale=1.0"),),
        (ACCEPTANCE_PRIOR,),
    ),
    Mutant(
        "shadow_double_decay",
        "a root-only round with shadow trials decays the estimates twice (observe_walk and commit both record)",
        (("engine/drafters.py", "        if tree.num_nodes == 1 and self._shadow:\n            return", "        if False:\n            return"),),
        (ACCEPTANCE_PRIOR,),
    ),
    Mutant(
        "shadow_on_real_trees",
        "a round that scored a real tree also records its root candidates as shadow trials (counted twice)",
        (("engine/drafters.py", "if tree.num_nodes == 1 and self.shadow_trials else ()", "if self.shadow_trials else ()"),),
        (ACCEPTANCE_PRIOR,),
    ),
    Mutant(
        "sibling_rank_ignored",
        "every candidate is classed as the best sibling (a second-place adjacency candidate keeps its rank-0 rate)",
        (("engine/drafters.py", "            rank = min(rank, SIBLING_RANKS - 1)", "            rank = 0"),),
        ("tests/engine/test_sibling_ranks.py",),
    ),
    Mutant(
        "sibling_rank_by_learned_rates",
        "siblings are ranked by their learned rates alone (all 0 under a zero prior, so ties rank them by arrival)",
        (("engine/drafters.py", "        base = sorted(sources.values(), key=lambda entry: (-self._union(entry[1], 0), -_prior_union(entry[1])))",
          "        base = sorted(sources.values(), key=lambda entry: -self._union(entry[1], 0))"),),
        ("tests/engine/test_sibling_ranks.py",),
    ),
    Mutant(
        "merge_union_dropped",
        "a token offered by a copy and the adjacency row keeps only its better source's rate",
        (("engine/drafters.py", "        miss *= 1.0 - rate", "        miss = min(miss, 1.0 - rate)"),),
        ("tests/engine/test_sibling_ranks.py",),
    ),
    Mutant(
        "best_prefix_by_round_ratio",
        "the tree keeps the prefix with the round's best tokens-per-cost ratio instead of the gain over plain decoding",
        (("draft/tree_policy.py", "        gain = 1.0 + total - costs[nodes - 1] / plain", "        gain = (1.0 + total) / costs[nodes - 1] - 1.0 / plain"),),
        ("tests/draft/test_tree_policy.py",),
    ),
    Mutant(
        "batch_merge_stops_early",
        "the batch budget's lazy merge stops while a longer prefix could still gain more",
        (("engine/batch_budget.py", "best - (batch + gained - prices[taken]) - 1e-9)", "best - (batch + gained - prices[taken]) + 0.5)"),),
        ("tests/engine/test_batch_budget.py",),
    ),
    Mutant(
        "batch_adjacency_refresh_skips_last_sequence",
        "the batch's adjacency refresh leaves out the last sequence's scored rows",
        (("engine/batch.py", "        for seq in running:\n            drafter = getattr(seq.decoder, \"drafter\", None)\n            if seq.done",
          "        for seq in running[:-1]:\n            drafter = getattr(seq.decoder, \"drafter\", None)\n            if seq.done"),),
        ("tests/engine/test_batch_engine.py::test_the_batch_refreshes_the_shared_adjacency_table_once_per_forward",),
    ),
    Mutant(
        "batch_split_by_ratio",
        "the batch budget keeps the prefix with the best tokens per second, not the gain over plain batched decoding",
        (("engine/batch_budget.py", "        value = (batch + gained) - prices[taken + 1]", "        value = (batch + gained) / seconds[taken + 1]"),
         ("engine/batch_budget.py", "best, best_expected = 0, batch - prices[0], float(batch)", "best, best_expected = 0, batch / seconds[0], float(batch)")),
        ("tests/engine/test_batch_budget.py",),
    ),
    Mutant(
        "cost_tables_kept_stale",
        "a reading does not renew the cost tables kept between readings (the policy never follows the machine)",
        (("engine/cost_model.py", "        self._estimates = None\n        self._stale = True", "        self._estimates = None"),),
        ("tests/engine/test_cost_model.py",),
    ),
    Mutant(
        "standing_seconds_recomputed",
        "a resting round recomputes the cost model's estimates for its prediction (the ~40 us a round it was made to save)",
        (("engine/cost_model.py", "        if self._table is not None and self._table.size >= scored_tokens:\n            return float(self._table[scored_tokens - 1])\n", ""),),
        ("tests/engine/test_cost_model.py",),
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

ROW_SHAPE = "models/row_shape.py"
NATIVE = "models/native_llama.py"
ROW_SHAPE_TESTS = "tests/models/test_row_shape.py"
BATCH_INVARIANT_TESTS = "tests/engine/test_batch_invariant.py"
MUTANTS += [
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


BATCH_RUNNER = "models/batch_runner.py"
BATCH_RUNNER_TESTS = "tests/models/test_batch_runner.py"
MUTANTS += [
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
]


REST_TESTS = "tests/engine/test_rest_schedule.py"
MUTANTS += [
    Mutant(
        "rest_round_skips_drafter_commit",
        "a resting round decodes plainly but does not tell the drafter (its context index falls out of step)",
        (("engine/decoder.py", "                self.drafter.commit([], output_tokens[0])\n                decision = RoundDecision(1, 1.0",
          "                decision = RoundDecision(1, 1.0"),),
        (REST_TESTS,),
    ),
    Mutant(
        "rest_never_wakes",
        "a resting drafter never proposes again (no shadow trials, no probes: speculation never restarts)",
        (("draft/tree_policy.py", " or self.rested + 1 >= self.wake_every:", ":"),),
        (REST_TESTS,),
    ),
]

def apply(mutant: Mutant, root: Path) -> str | None:
    """Edit the copy under ``root``; returns an error text if an edit does not match once."""
    for relative, old, new in mutant.edits:
        path = root / PACKAGE / relative
        text = path.read_text()
        count = text.count(old)
        if count != 1:
            return f"{relative}: pattern found {count} times"
        path.write_text(text.replace(old, new))
    return None


def run(mutant: Mutant, timeout: int) -> tuple[str, str, float]:
    with tempfile.TemporaryDirectory(prefix=f"mutant-{mutant.name}-") as tmp:
        root = Path(tmp)
        shutil.copytree(REPO / "src", root / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
        problem = apply(mutant, root)
        if problem:
            return "NOT APPLIED", problem, 0.0
        env = dict(os.environ, PYTHONPATH=str(root / "src"), OMP_NUM_THREADS="1", PYTHONDONTWRITEBYTECODE="1")
        start = time.perf_counter()
        try:
            proc = subprocess.run(
                [sys.executable, "-m", "pytest", "-q", "--maxfail=2", "-rf", "-p", "no:cacheprovider", *mutant.tests],
                cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout,
            )
        except subprocess.TimeoutExpired:
            return "TIMEOUT", "", time.perf_counter() - start
        seconds = time.perf_counter() - start
        failed = re.findall(r"^FAILED (\S+)", proc.stdout, flags=re.M)
        if proc.returncode == 0:
            return "SURVIVED", "", seconds
        if not failed:
            return "ERROR", proc.stdout[-400:].replace("\n", " "), seconds
        return "caught", ", ".join(f.split("/")[-1] for f in failed), seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("names", nargs="*", help="mutants to run (default: all)")
    parser.add_argument("--list", action="store_true")
    parser.add_argument("--timeout", type=int, default=900)
    args = parser.parse_args()
    chosen = [m for m in MUTANTS if not args.names or m.name in args.names]
    if args.list or not chosen:
        for m in MUTANTS:
            print(f"{m.name:26s} {m.description}")
        return 0 if chosen or args.list else 2
    print(f"| mutant | what it breaks | result | caught by | s |\n|---|---|---|---|---|")
    bad = 0
    for mutant in chosen:
        status, detail, seconds = run(mutant, args.timeout)
        bad += status != "caught"
        print(f"| {mutant.name} | {mutant.description} | {status} | {detail} | {seconds:.0f} |", flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
