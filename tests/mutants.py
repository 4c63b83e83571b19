"""Mutation check of the exactness suite (issue 10): apply plausible one-line bugs to a temporary
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
P_u(x) = 0 and every later surplus at x is [0 - Q_u(x)]_+ = 0 whatever Q_u(x) holds.
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
EDGES = "tests/verify/test_edge_cases.py"
TREE_TESTS = "tests/core/test_tree.py"


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
        ((GREEDY, "self.below[i + 1] = self.below[i] + self.mass[i] * below_mass(",
          "self.below[i + 1] = self.below[i] + below_mass("),),
        (GREEDY_TESTS,),
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
        (("verify/bv.py", "lambda: residual(target_rows[tau], draft_rows[tau], target_scale=w)",
          "lambda: residual(target_rows[tau], draft_rows[tau])"),),
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
        (("verify/spectr.py", "        return _kseq_candidates(rng, target, draft, tokens)\n",
          "        return _kseq_candidates(rng, target, draft, tokens, lambda t, d, k: kseq_rho_bracket(t, d, k, 2)[0], root_form_residual)\n"),),
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
        (("verify/gmpbv.py", "block_verify_path(rng, target_rows, law, tokens, law.token_probs)",
          "block_verify_path(rng, target_rows, draft_rows, tokens)"),),
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


# issue 16: the tree rules on the target's support (verify/support.py, rrs.py, spechub.py, traversal.py)
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
