"""Exactness of the path-based block rules by exact enumeration (ALGORITHMS.md §14.5 items 1, 2,
4, 5, 9): SD, BV, GBV-mod, SpecTr-GBV (published and ★), greedy multi-path BV, traversal."""

from fractions import Fraction

import pytest

from tests.conftest import toy_pair
from tests.verify.exact import EXACT_TOLERANCE, block_error, generation_error, paths_sampler, tree_sampler
from verispec.core.tree import DraftScheme
from verispec.models.toy import context_free_pair
from verispec.theory import closed_forms as cf
from verispec.theory.enumerate import block_law, max_abs_difference
from verispec.verify.bv import BlockVerification
from verispec.verify.gbv_mod import GBVMod, GBVModWithoutModification
from verispec.verify.gmpbv import GreedyMultiPathBV
from verispec.verify.sd import SpeculativeSampling
from verispec.verify.spectr_gbv import SpecTrGBVPublished, SpecTrGBVPublishedWithoutModification
from verispec.verify.spectr_gbv_star import SpecTrGBVStar
from verispec.verify.traversal import TraversalVerification

SINGLE_PATH = [(3, 2), (3, 3), (4, 2), (4, 3)]
MULTI_PATH = [(3, 2, 1), (3, 2, 2), (3, 2, 3), (4, 2, 2), (3, 3, 2), (4, 3, 1)]


@pytest.mark.parametrize("vocab,length", SINGLE_PATH)
@pytest.mark.parametrize("verifier", [SpeculativeSampling(), BlockVerification(), GBVMod()], ids=lambda v: v.name)
def test_single_path_rules_are_exact_per_block(verifier, vocab, length):
    target, draft = toy_pair(vocab, seed=vocab * 10 + length)
    error, _ = block_error(verifier, paths_sampler(1, length), target, draft, length + 1)
    assert error < EXACT_TOLERANCE


@pytest.mark.parametrize("vocab,length,num_drafts", MULTI_PATH)
@pytest.mark.parametrize(
    "verifier", [GreedyMultiPathBV(), SpecTrGBVStar(), TraversalVerification()], ids=lambda v: v.name
)
def test_multi_path_rules_are_exact_per_block(verifier, vocab, length, num_drafts):
    target, draft = toy_pair(vocab, seed=vocab * 100 + length * 10 + num_drafts)
    error, _ = block_error(verifier, paths_sampler(num_drafts, length), target, draft, length + 1)
    assert error < EXACT_TOLERANCE


@pytest.mark.parametrize("vocab,length,num_drafts", [(3, 2, 2), (4, 2, 2), (3, 3, 2)])
def test_traversal_is_exact_on_brooms_scheme_b(vocab, length, num_drafts):
    target, draft = toy_pair(vocab, seed=7 + vocab)
    error, _ = block_error(TraversalVerification(), paths_sampler(num_drafts, length, merge=False), target, draft, length + 1)
    assert error < EXACT_TOLERANCE


@pytest.mark.parametrize(
    "shape,scheme",
    [([2, 2], DraftScheme.WITHOUT_REPLACEMENT), ([3, 1], DraftScheme.WITHOUT_REPLACEMENT), ([2, 2], DraftScheme.IID_TREE)],
)
def test_traversal_is_exact_on_sampled_trees(shape, scheme):
    target, draft = toy_pair(4, seed=21)
    error, _ = block_error(TraversalVerification(), tree_sampler(shape, scheme), target, draft, len(shape) + 1)
    assert error < EXACT_TOLERANCE


# ----- several iterations with nested modifications (§14.1 item 4) ---------------------------
@pytest.mark.parametrize("vocab,length,num_tokens", [(3, 2, 4), (2, 3, 5), (3, 3, 4)])
def test_gbv_mod_is_exact_over_several_iterations(vocab, length, num_tokens):
    target, draft = toy_pair(vocab, seed=31 + vocab, zero_frac=0.2 if vocab > 2 else 0.0)
    assert generation_error(GBVMod(), paths_sampler(1, length), target, draft, num_tokens) < EXACT_TOLERANCE


@pytest.mark.parametrize("vocab,length,num_drafts,num_tokens", [(3, 2, 2, 3), (2, 2, 3, 4), (3, 2, 2, 4)])
def test_spectr_gbv_star_is_exact_over_several_iterations(vocab, length, num_drafts, num_tokens):
    target, draft = toy_pair(vocab, seed=41 + vocab, zero_frac=0.2 if vocab > 2 else 0.0)
    sampler = paths_sampler(num_drafts, length)
    assert generation_error(SpecTrGBVStar(), sampler, target, draft, num_tokens) < EXACT_TOLERANCE


# ----- negative controls (§14.2): these must fail -------------------------------------------
@pytest.mark.parametrize("vocab,length", [(3, 2), (4, 3)])
def test_gbv_mod_without_modification_fails(vocab, length):
    target, draft = toy_pair(vocab, seed=vocab * 10 + length)
    error, _ = block_error(GBVModWithoutModification(), paths_sampler(1, length), target, draft, length + 1)
    assert error > 1e-3
    target, draft = toy_pair(3, seed=33, zero_frac=0.2)
    assert generation_error(GBVMod(), paths_sampler(1, 2), target, draft, 4, apply_modification=False) > 1e-3


@pytest.mark.parametrize("vocab,length,num_drafts,zero_frac", [(3, 2, 2, 0.0), (4, 2, 2, 0.0), (3, 2, 3, 0.0), (4, 2, 2, 0.25)])
@pytest.mark.parametrize(
    "verifier", [SpecTrGBVPublished(), SpecTrGBVPublishedWithoutModification()], ids=lambda v: v.name
)
def test_published_spectr_gbv_is_not_lossless_for_k_at_least_2(verifier, vocab, length, num_drafts, zero_frac):
    target, draft = toy_pair(vocab, seed=2, zero_frac=zero_frac)
    error, _ = block_error(verifier, paths_sampler(num_drafts, length), target, draft, length + 1)
    assert error > 1e-3


def test_published_spectr_gbv_fails_over_iterations_and_star_without_modification_fails():
    target, draft = toy_pair(3, seed=43, zero_frac=0.0)
    sampler = paths_sampler(2, 2)
    assert generation_error(SpecTrGBVPublished(), sampler, target, draft, 3) > 1e-3
    assert generation_error(SpecTrGBVStar(), sampler, target, draft, 3, apply_modification=False) > 1e-3


# ----- K = 1 reductions (§14.3) --------------------------------------------------------------
@pytest.mark.parametrize("vocab,length", [(3, 2), (4, 3)])
def test_k1_reductions(vocab, length):
    target, draft = toy_pair(vocab, seed=51 + length)
    sampler = paths_sampler(1, length)
    laws = {v.name: block_law(v, sampler, target, draft).probs for v in [
        BlockVerification(), GreedyMultiPathBV(), TraversalVerification(), GBVMod(), SpecTrGBVPublished(), SpecTrGBVStar()
    ]}
    assert max_abs_difference(laws["traversal"], laws["bv"]) < 1e-12
    assert max_abs_difference(laws["gmpbv"], laws["bv"]) < 1e-12
    assert max_abs_difference(laws["spectr-gbv"], laws["gbv-mod"]) < 1e-12
    assert max_abs_difference(laws["spectr-gbv-star"], laws["gbv-mod"]) < 1e-12
    error, _ = block_error(SpecTrGBVPublished(), sampler, target, draft, length + 1)
    assert error < EXACT_TOLERANCE  # the published rule is exact at K = 1 (§6.2 item 1)


# ----- expected lengths against closed forms (§14.1 item 5) ------------------------------------
@pytest.mark.parametrize("vocab,length", [(3, 2), (4, 3)])
def test_single_path_expected_lengths_match_closed_forms(vocab, length):
    target, draft = toy_pair(vocab, seed=61 + vocab)
    sampler = paths_sampler(1, length)
    sd = block_law(SpeculativeSampling(), sampler, target, draft).expected_accepted_len
    bv = block_law(BlockVerification(), sampler, target, draft).expected_accepted_len
    gbv = block_law(GBVMod(), sampler, target, draft).expected_accepted_len
    assert sd == pytest.approx(cf.expected_len_sd(target, draft, length), abs=1e-9)
    assert bv == pytest.approx(cf.expected_len_bv(target, draft, length), abs=1e-9)
    assert gbv == pytest.approx(cf.expected_len_gbv_mod(target, draft, length), abs=1e-9)
    assert sd <= bv + 1e-12 <= gbv + 2e-12  # BV >= SD, GBV-mod >= BV (§15)


@pytest.mark.parametrize("vocab,length,num_drafts", [(3, 2, 2), (3, 2, 3), (4, 2, 2), (3, 3, 2)])
def test_multi_path_expected_lengths_match_closed_forms(vocab, length, num_drafts):
    target, draft = toy_pair(vocab, seed=71 + vocab + num_drafts)
    sampler = paths_sampler(num_drafts, length)
    gmpbv = block_law(GreedyMultiPathBV(), sampler, target, draft).expected_accepted_len
    star = block_law(SpecTrGBVStar(), sampler, target, draft).expected_accepted_len
    assert gmpbv == pytest.approx(cf.expected_len_gmpbv(target, draft, length, num_drafts), abs=1e-9)
    assert star == pytest.approx(cf.expected_len_spectr_gbv_star(target, draft, length, num_drafts), abs=1e-9)


# ----- test vectors (§14.4) -----------------------------------------------------------------
def _bv_paper_example():
    return context_free_pair([1 / 3, 2 / 3], [2 / 3, 1 / 3])


def _as_fraction(value: float, denominator: int) -> Fraction:
    fraction = Fraction(value).limit_denominator(denominator)
    assert abs(float(fraction) - value) < 1e-12
    return fraction


def test_bv_paper_example_single_path():
    target, draft = _bv_paper_example()
    sampler = paths_sampler(1, 2)
    values = [block_law(v, sampler, target, draft).expected_accepted_len for v in [SpeculativeSampling(), BlockVerification(), GBVMod()]]
    assert [_as_fraction(v, 1000) for v in values] == [Fraction(10, 9), Fraction(11, 9), Fraction(12, 9)]


@pytest.mark.parametrize("num_drafts,gmpbv,star,bound", [(2, Fraction(131, 81), Fraction(134, 81), Fraction(19, 12)), (3, Fraction(1289, 729), Fraction(1297, 729), Fraction(83, 48))])
def test_bv_paper_example_multi_path(num_drafts, gmpbv, star, bound):
    target, draft = _bv_paper_example()
    sampler = paths_sampler(num_drafts, 2)
    assert _as_fraction(block_law(GreedyMultiPathBV(), sampler, target, draft).expected_accepted_len, 10_000) == gmpbv
    assert _as_fraction(block_law(SpecTrGBVStar(), sampler, target, draft).expected_accepted_len, 10_000) == star
    assert _as_fraction(cf.claimed_bound_spectr_gbv(target, draft, 2, num_drafts), 10_000) == bound
    assert _as_fraction(cf.expected_len_gmpbv(target, draft, 2, num_drafts), 10_000) == gmpbv
    assert _as_fraction(cf.expected_len_spectr_gbv_star(target, draft, 2, num_drafts), 10_000) == star
    assert gmpbv > bound  # the claimed "maximum" is exceeded by a lossless rule (§6.2 item 3)
