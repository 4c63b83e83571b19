"""Mutants of the verification rules (src/verispec/verify), one section per rule: the greedy
selection and skewed law of GMPBV / SpecTr-GBV★, the chain rules, the modification windows, the
tree rules, and the rules' reads and draws on the target's support."""

from __future__ import annotations

from .base import BLOCK, TREE_TESTS, Mutant

GREEDY = "verify/greedy_selection.py"
GREEDY_TESTS = "tests/verify/test_greedy_selection.py"
FAST_BELOW_TESTS = "tests/verify/test_below_mass_fast.py"
BRANCHING = "tests/verify/test_branching_roots.py"
EDGES = "tests/verify/test_edge_cases.py"
SUPPORT_TESTS = "tests/verify/test_support.py"

MUTANTS = [
    # the greedy selection and the skewed law q̃ of GMPBV / SpecTr-GBV★ (verify/greedy_selection.py)
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
        "k1_fallback",
        "IID_PATHS tree without raw paths silently verified with K = 1",
        ((GREEDY, "        if tree.num_paths < 1:\n            raise InvalidDraftError(",
          "        if tree.num_paths < 1:\n            return 1\n            raise InvalidDraftError("),),
        (TREE_TESTS, "tests/verify/test_scheme_errors.py"),
    ),

    # the chain rules SD, BV and GMPBV (verify/sd.py, bv.py, gmpbv.py)
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
        "gmpbv_plain_q",
        "GMPBV runs BV with the plain draft q instead of q̃",
        (("verify/gmpbv.py", "block_verify_draw(rng, tree, rows, law, tokens, law.token_probs)",
          "block_verify_draw(rng, tree, rows, draft_rows, tokens)"),),
        (BLOCK,),
    ),
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

    # GBV-mod, SpecTr-GBV★ and their modification windows (verify/gbv_mod.py, spectr_gbv_star.py, modification.py)
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

    # RRS and RRSw (verify/rrs.py)
    Mutant(
        "rrs_dedup",
        "RRS runs its with-replacement formulas on the deduplicated trie children",
        (("verify/rrs.py", "raw = tree.scheme in (DraftScheme.CHAIN, DraftScheme.IID_PATHS)", "raw = False"),),
        ("tests/verify/test_rrs.py", BRANCHING),
    ),
    Mutant(
        "rrsw_no_draft_update",
        "RRSw keeps the with-replacement draft after a rejection",
        (("verify/rrs.py", "return _recursive_rejection(rng, target, draft, tokens, without_replacement=True, node=node)",
          "return _recursive_rejection(rng, target, draft, tokens, without_replacement=False, node=node)"),),
        ("tests/verify/test_rrs.py", BRANCHING),
    ),
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

    # SpecTr K-SEQ (verify/spectr.py)
    Mutant(
        "spectr_rho_wrong_side",
        "SpecTr K-SEQ with rho from the f < 0 side and the root-form residual",
        (("verify/spectr.py", "        return kseq_node(rng, target, draft, node, tokens)\n",
          "        return kseq_node(rng, target, draft, node, tokens, lambda t, d, k: kseq_rho_bracket(t, d, k, 2)[0], root_form_residual)\n"),),
        ("tests/verify/test_spectr.py", BRANCHING),
    ),
    Mutant(
        "spectr_rho_on_draft_support",
        "SpecTr finds rho on the draft's support (D(rho) misses p where q = 0)",
        (("verify/spectr.py", "        ids, p = target.support(node)\n        return rho_fn(p, draft.gather(node, ids), k)",
          "        ids = draft.support(node)[0]\n        return rho_fn(target.gather(node, ids), draft.gather(node, ids), k)"),),
        ("tests/verify/test_spectr.py",),
    ),

    # SpecHub (verify/spechub.py)
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

    # traversal (verify/traversal.py)
    Mutant(
        "traversal_no_q_update",
        "traversal skips the Q_u update on scheme (a) trees",
        (("verify/traversal.py", "            if update_draft:", "            if False:"),),
        (BLOCK, BRANCHING),
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

    # NSS and the q-free walk (verify/qfree.py)
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

    # laws kept over the target's support (verify/support.py)
    Mutant(
        "support_not_realigned",
        "a law kept over one support is drawn over another support of the row without realigning",
        (("verify/support.py", "if ids is law_ids or (len(ids) == len(law_ids) and np.array_equal(ids, law_ids)):",
          "if True:"),),
        (SUPPORT_TESTS,),
    ),
]
