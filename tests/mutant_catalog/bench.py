"""Mutants of the bench layer (src/verispec/bench): the replay of recorded drafts and the per-chain
expectations of the claims table."""

from __future__ import annotations

from .base import Mutant

REPLAY = "bench/replay.py"
COMPARE_REPLAYING = "bench/compare/replaying.py"
REPLAY_TESTS = "tests/bench/test_replay_modification.py"
COMPARE_TESTS = "tests/bench/test_compare.py"

MUTANTS = [
    # replay of real drafts and the per-chain expectations of the claims table (verispec compare)
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
