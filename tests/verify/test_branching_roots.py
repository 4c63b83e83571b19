"""Exact per-block laws of every multi-path rule on drafts that really branch at the root
(issue 10 item 2; ALGORITHMS.md §14.1 item 3, §14.5 items 3, 5, 6, 7, 9).

The older K = 2..3 fixtures mostly drew a point-mass root, so all paths shared their first token.
Here each fixture asserts, by enumerating the sampler itself, that the root has >= 2 distinct
children with probability >= 0.5, and that the toy models carry exact zeros (p = 0 on drafted
tokens, q = 0 on target tokens). V = 3, L = 2, K = 3 and 4 keep each enumeration to seconds.
"""

import itertools

import numpy as np
import pytest

from tests.conftest import toy_pair
from tests.verify.exact import EXACT_TOLERANCE, block_error, paths_sampler, tree_sampler
from tests.verify.fixtures import root_branching_probability
from verispec.core.tree import DraftScheme
from verispec.verify.gmpbv import GreedyMultiPathBV
from verispec.verify.nss import NaiveSpecInfer
from verispec.verify.rrs import RRS, RRSw
from verispec.verify.spechub import SpecHub
from verispec.verify.spectr import SpecTr
from verispec.verify.spectr_gbv_star import SpecTrGBVStar
from verispec.verify.traversal import TraversalVerification

# (vocab, seed): roots q(.|()) = (.19, .41, .40) with p = (.13, .87, 0); (.48, .31, .21);
# (.40, .42, .18); V = 4: (.16, .57, 0, .27) with p(0) = 0
PAIRS = [(3, 1), (3, 4), (3, 31), (4, 1)]
PATH_RULES = [SpecTr(), GreedyMultiPathBV(), SpecTrGBVStar(), TraversalVerification(), RRS(), RRSw(), NaiveSpecInfer()]


def _checked_pair(vocab, seed, sampler, length):
    target, draft = toy_pair(vocab, seed=seed, zero_frac=0.25)
    assert root_branching_probability(sampler, draft) >= 0.5, "the fixture must branch at the root"
    prefixes = [z for depth in range(length + 1) for z in itertools.product(range(vocab), repeat=depth)]
    assert any((target(z) == 0).any() for z in prefixes) and any((draft(z) == 0).any() for z in prefixes)
    return target, draft


PATH_CASES = [(vocab, seed, 3) for vocab, seed in PAIRS] + [(3, 1, 4)]


@pytest.mark.parametrize("vocab,seed,num_drafts", PATH_CASES, ids=[f"V{v}-s{s}-K{k}" for v, s, k in PATH_CASES])
@pytest.mark.parametrize("verifier", PATH_RULES, ids=lambda v: v.name)
def test_multi_path_rules_are_exact_on_branching_roots(verifier, vocab, seed, num_drafts):
    """K = 4 on one pair only: V = 3, L = 2, K = 4 is 3^8 drafts, 20-50 s per rule here."""
    sampler = paths_sampler(num_drafts, 2)
    target, draft = _checked_pair(vocab, seed, sampler, 2)
    error, _ = block_error(verifier, sampler, target, draft, 3)
    assert error < EXACT_TOLERANCE


TREE_CASES = [
    (RRS(), [3, 1], DraftScheme.IID_TREE),
    (RRS(), [2, 2], DraftScheme.IID_TREE),
    (RRSw(), [3, 1], DraftScheme.WITHOUT_REPLACEMENT),
    (RRSw(), [2, 2], DraftScheme.WITHOUT_REPLACEMENT),
    (TraversalVerification(), [3, 1], DraftScheme.WITHOUT_REPLACEMENT),
    (TraversalVerification(), [2, 2], DraftScheme.IID_TREE),
    (NaiveSpecInfer(), [3, 1], DraftScheme.WITHOUT_REPLACEMENT),
    (SpecHub(), [2, 2], DraftScheme.SPECHUB_PAIR),
]
TREE_PAIRS = [(3, 1), (4, 1)]


@pytest.mark.parametrize("vocab,seed", TREE_PAIRS, ids=[f"V{v}-s{s}" for v, s in TREE_PAIRS])
@pytest.mark.parametrize(
    "verifier,shape,scheme", TREE_CASES, ids=[f"{v.name}-{s.value}-{'x'.join(map(str, b))}" for v, b, s in TREE_CASES]
)
def test_tree_rules_are_exact_on_branching_roots(verifier, shape, scheme, vocab, seed):
    sampler = tree_sampler(shape, scheme)
    target, draft = _checked_pair(vocab, seed, sampler, len(shape))
    error, _ = block_error(verifier, sampler, target, draft, len(shape) + 1)
    assert error < EXACT_TOLERANCE
