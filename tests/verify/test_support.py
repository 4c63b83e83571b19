"""The tree rules on the target's support (issue 16; ALGORITHMS.md §8, §9, §12, §14.1).

RRS, RRSw, SpecHub and traversal keep their vectors over ``target.support(node)`` and read the
draft there through ``draft.gather`` (verify/support.py). What these tests catch:
* a rule that still reads a whole row (``row()`` / ``dense()``) of the target or the draft: the
  strict backends below raise on it, so a regression to O(V) work per node fails here;
* a rule that assumes the support lists only positive entries, or that the support it read while
  testing candidates is the array ``draw_on_support`` hands back at the draw (the interface allows
  any ascending superset of the positive entries, zeros included): the strict target lists extra
  zero-probability tokens, different ones on every call, and every output must equal the output
  of the same rule on plain ``DenseRows`` with the same random numbers (whose exactness the
  enumeration suites prove);
* the small index helpers (value_at, positions_of, realigned) on hand-made cases.
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.conftest import toy_pair
from verispec.core.rng import SeededRng
from verispec.core.rows import DenseRows
from verispec.core.tree import DraftScheme
from verispec.draft.samplers import sample_iid_paths, sample_tree
from verispec.verify.registry import get_method
from verispec.verify.support import positions_of, realigned, value_at


class _WholeRowRead(AssertionError):
    pass


class StrictTargetRows(DenseRows):
    """DenseRows that refuse whole-row reads and list extra zero-probability tokens in every
    support, a different random choice on each call (allowed by the Rows.support contract)."""

    def __init__(self, probs, greedy: bool = False, seed: int = 0):
        super().__init__(probs, greedy=greedy)
        self.padding = np.random.default_rng(seed)
        self.support_calls = 0

    def row(self, node):
        raise _WholeRowRead(f"the rule read all V entries of target row {node}")

    def dense(self):
        raise _WholeRowRead("the rule read every target row")

    def argmax(self, node):
        return int(np.argmax(self.array[node]))

    def support(self, node):
        self.support_calls += 1
        values = self.array[node]
        zeros = np.flatnonzero(values == 0)
        extra = zeros[self.padding.random(len(zeros)) < 0.5]
        ids = np.union1d(np.flatnonzero(values > 0), extra).astype(np.int64)
        return ids, values[ids]


class StrictDraftRows(DenseRows):
    """DenseRows of the draft that allow entries, gathers and the argmax, never a whole row."""

    def row(self, node):
        raise _WholeRowRead(f"the rule read all V entries of draft row {node}")

    def dense(self):
        raise _WholeRowRead("the rule read every draft row")

    def argmax(self, node):
        return int(np.argmax(self.array[node]))


# (rule, how its drafts are drawn, shape)
CASES = [
    ("rrs", "iid_tree", [3, 2]),
    ("rrs", "iid_paths", [3, 2]),
    ("rrs", "chain", [1, 1, 1]),
    ("rrsw", "without_replacement", [3, 2]),
    ("rrsw", "iid_paths", [3, 2]),
    ("spechub", "spechub_pair", [2, 2, 1]),
    ("traversal", "iid_paths", [3, 2]),
    ("traversal", "without_replacement", [3, 2]),
    ("traversal", "iid_tree", [3, 2]),
    ("traversal", "chain", [1, 1, 1]),
]


def _skeleton(rng, draft, case, shape):
    if case == "chain":
        return sample_iid_paths(rng, draft, 1, len(shape))
    if case == "iid_paths":
        return sample_iid_paths(rng, draft, shape[0], len(shape))
    return sample_tree(rng, draft, shape, DraftScheme(case))


@pytest.mark.parametrize("greedy", [False, True], ids=["sampled", "greedy-target"])
@pytest.mark.parametrize("rule,case,shape", CASES, ids=lambda x: str(x))
def test_rules_on_the_support_match_full_rows_and_read_no_whole_row(rule, case, shape, greedy):
    verifier = get_method(rule).verifier
    draws = 0
    for seed in range(25):
        vocab = 5 + seed % 6
        target, draft = toy_pair(vocab, seed=500 + seed, zero_frac=0.3)
        skeleton = _skeleton(SeededRng(seed), draft, case, shape)
        target_probs = np.stack([target(prefix) for prefix in skeleton.prefixes])
        if greedy:  # point masses at the argmax (lowest id on ties), as LogitRows at T = 0
            onehot = np.zeros_like(target_probs)
            onehot[np.arange(len(onehot)), np.argmax(target_probs, axis=1)] = 1.0
            target_probs = onehot
        draft_probs = skeleton.draft.dense()
        reference = skeleton.with_target(DenseRows(target_probs, greedy=greedy), validate=False)
        strict_target = StrictTargetRows(target_probs, greedy=greedy, seed=seed)
        strict = type(reference).build(reference.tokens, reference.parents, strict_target,
                                       StrictDraftRows(draft_probs), reference.scheme, reference.paths, validate=False)
        for draw in range(4):
            want = verifier.verify(reference, SeededRng(1000 * seed + draw))
            got = verifier.verify(strict, SeededRng(1000 * seed + draw))
            assert (got.accepted_node, got.next_token, got.is_bonus) == (want.accepted_node, want.next_token, want.is_bonus)
            draws += not want.is_bonus
        if not greedy:
            assert strict_target.support_calls > 0  # the draws really went through the support
    assert draws > 0, "the fixture must reach residual draws (rejections), not only bonus tokens"


def test_value_at_reads_listed_entries_and_zero_elsewhere():
    ids, values = np.array([1, 4, 7]), np.array([0.2, 0.0, 0.8])
    assert [value_at(ids, values, t) for t in (0, 1, 4, 7, 9)] == [0.0, 0.2, 0.0, 0.8, 0.0]
    assert value_at(np.zeros(0, dtype=np.int64), np.zeros(0), 3) == 0.0


def test_positions_of_drops_tokens_outside_the_support():
    ids = np.array([2, 3, 9])
    np.testing.assert_array_equal(positions_of(ids, [9, 0, 3, 10]), [2, 1])
    assert positions_of(ids, []).size == 0 and positions_of(np.zeros(0, dtype=np.int64), [1]).size == 0


def test_realigned_moves_a_law_onto_another_support_of_the_same_row():
    law_ids, law = np.array([1, 4, 7]), np.array([0.25, 0.0, 0.75])
    assert realigned(law_ids, law, law_ids) is law  # the same support: no copy
    np.testing.assert_array_equal(realigned(law_ids, law, np.array([0, 1, 5, 7, 9])), [0.0, 0.25, 0.0, 0.75, 0.0])
    np.testing.assert_array_equal(realigned(law_ids, law, np.array([1, 7])), [0.25, 0.75])  # 4 held no mass
