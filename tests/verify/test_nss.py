"""SpecInfer NSS (ALGORITHMS.md §13): exact for every draft scheme (deterministic top-k trees
included), acceptance at a node = sum of p over its distinct child tokens, bonus at leaves."""

import numpy as np
import pytest

from tests.conftest import toy_pair
from tests.verify.exact import EXACT_TOLERANCE, block_error, paths_sampler, tree_sampler
from verispec.core.rng import SeededRng
from verispec.core.tree import DraftScheme, DraftTree
from verispec.models.toy import context_free_pair
from verispec.theory.enumerate import block_law
from verispec.verify.nss import NaiveSpecInfer

CASES = [
    ("chain", 4, paths_sampler(1, 3), 3),
    ("paths", 3, paths_sampler(2, 2), 2),
    ("paths-L3", 3, paths_sampler(2, 3), 3),
    ("broom", 3, paths_sampler(3, 2, merge=False), 2),
    ("iid-tree", 3, tree_sampler([3, 2], DraftScheme.IID_TREE), 2),
    ("without-replacement", 4, tree_sampler([2, 2], DraftScheme.WITHOUT_REPLACEMENT), 2),
    ("spechub", 4, tree_sampler([2, 2], DraftScheme.SPECHUB_PAIR), 2),
    ("deterministic", 4, tree_sampler([2, 2], DraftScheme.DETERMINISTIC), 2),
    ("deterministic-deep", 3, tree_sampler([2, 1, 2], DraftScheme.DETERMINISTIC), 3),
]


@pytest.mark.parametrize("vocab,sampler,length", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_nss_is_exact_on_every_scheme(vocab, sampler, length):
    target, draft = toy_pair(vocab, seed=80 + vocab + length)
    error, _ = block_error(NaiveSpecInfer(), sampler, target, draft, length + 1)
    assert error < EXACT_TOLERANCE


def test_acceptance_is_the_target_mass_of_the_distinct_children():
    target_vec, draft_vec = np.array([0.1, 0.2, 0.3, 0.4]), np.array([0.4, 0.3, 0.2, 0.1])
    target, draft = context_free_pair(target_vec, draft_vec)
    law = block_law(NaiveSpecInfer(), tree_sampler([2], DraftScheme.DETERMINISTIC), target, draft)
    assert law.expected_accepted_len == pytest.approx(0.1 + 0.2, abs=1e-15)  # children: top-2 of q
    # i.i.d. children with duplicates: E[sum over distinct drawn tokens of p]
    law = block_law(NaiveSpecInfer(), tree_sampler([2], DraftScheme.IID_TREE), target, draft)
    expected = sum(draft_vec[a] * draft_vec[b] * (target_vec[a] + (target_vec[b] if b != a else 0.0)) for a in range(4) for b in range(4))
    assert law.expected_accepted_len == pytest.approx(expected, abs=1e-15)


def test_disjoint_supports_reject_everything_and_emit_the_target():
    target, draft = context_free_pair([0.5, 0.5, 0.0, 0.0], [0.0, 0.0, 0.4, 0.6])
    law = block_law(NaiveSpecInfer(), paths_sampler(3, 2), target, draft)
    assert law.expected_accepted_len == 0.0
    assert law.probs == pytest.approx({(0,): 0.5, (1,): 0.5}, abs=1e-15)


def test_bonus_token_at_a_leaf():
    # the target puts all its mass on the drafted tokens: the walk reaches the leaf
    target = np.array([[0.0, 1.0, 0.0], [0.0, 0.0, 1.0], [0.5, 0.25, 0.25]])
    draft = np.array([[0.3, 0.4, 0.3], [0.2, 0.2, 0.6], [0.0, 0.0, 0.0]])
    tree = DraftTree.build([-1, 1, 2], [-1, 0, 1], target, draft, DraftScheme.DETERMINISTIC)
    result = NaiveSpecInfer().verify(tree, SeededRng(0))
    assert result.accepted_tokens == (1, 2) and result.is_bonus


# Monte-Carlo with a stated power: tests/verify/test_monte_carlo.py
