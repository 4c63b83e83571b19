"""The GMPBV local order, selection and skewed law (ALGORITHMS.md §7.1-7.2, §14.5 item 5) and
the exact-tie fixtures of issue 10 item 1.

Selection and law must use ONE order (p/q ascending, q = 0 as +inf, ties by token id): a
selection that breaks ties one way and a law that breaks them the other way is lossy (max |Δ|
0.156 for GMPBV when p ≡ q). The tests here enumerate the law of the SELECTED path exactly and
compare it with Q̃ of the law, prefix by prefix, on fixtures with exact ties, so a tie-break
reversed in either place fails; and they check Σ_x Q̃(z, x) = Q̃(z) before any normalisation,
so a wrong C(z) fails.
"""

import itertools

import numpy as np
import pytest

from tests.conftest import toy_pair
from tests.verify.exact import EXACT_TOLERANCE, block_error, generation_error, paths_sampler
from tests.verify.fixtures import identical_pair, tied_pair
from verispec.core.rng import enumerate_outcomes
from verispec.verify.gmpbv import GreedyMultiPathBV
from verispec.verify.greedy_selection import (
    SkewedPathLaw,
    below_mass,
    below_mass_all,
    local_order,
    local_ratios,
    order_key,
    ranked_below,
    select_greedy_path,
)
from verispec.verify.spectr_gbv_star import SpecTrGBVStar

FIXTURES = {
    "p_equals_q": lambda: identical_pair(3, seed=11),
    "two_tied_ratios": lambda: tied_pair(seed=3),
    "two_tied_ratios_b": lambda: tied_pair(seed=8),
    "random_with_zeros": lambda: toy_pair(3, seed=17, zero_frac=0.25),
}


def _path_law(target, draft, tokens, num_drafts):
    prefixes = [tuple(tokens[:i]) for i in range(len(tokens))]
    return SkewedPathLaw([target(z) for z in prefixes] + [target(tuple(tokens))], [draft(z) for z in prefixes],
                         np.array(tokens), num_drafts)


def test_the_order_is_one_definition():
    """order_key, local_order, ranked_below, below_mass and below_mass_all agree on vectors with
    exact ties, p = 0 and q = 0 (ties: LOWER token id ranks LOWER)."""
    rng = np.random.default_rng(0)
    for _ in range(200):
        vocab = int(rng.integers(2, 9))
        draft = rng.choice([0.0, 0.125, 0.25, 0.5], size=vocab)
        target = rng.choice([0.0, 0.125, 0.25, 0.5], size=vocab)
        if draft.sum() == 0 or target.sum() == 0:
            continue
        draft, target = draft / draft.sum(), target / target.sum()
        ratios = local_ratios(target, draft)
        ids = np.arange(vocab)
        by_key = sorted(ids, key=lambda t: order_key(ratios, t, t))
        assert list(local_order(ratios, ids)) == by_key
        everything = below_mass_all(target, draft)
        for rank, token in enumerate(by_key):
            assert set(np.flatnonzero(ranked_below(ratios, token))) == set(by_key[:rank])
            expected = float(draft[by_key[:rank]].sum())
            assert below_mass(target, draft, token) == pytest.approx(expected, abs=1e-15)
            if draft[token] > 0:  # tokens with q = 0 carry no mass: their own value is unused
                assert everything[token] == pytest.approx(expected, abs=1e-15)
    # the tie rule itself, spelled out: equal ratios, the higher id ranks higher
    target, draft = np.array([0.25, 0.25, 0.5]), np.array([0.25, 0.25, 0.5])
    assert below_mass(target, draft, 1) == 0.25 and below_mass(target, draft, 0) == 0.0


@pytest.mark.parametrize("num_drafts", [2, 3])
@pytest.mark.parametrize("fixture", list(FIXTURES))
def test_selected_path_law_is_the_skewed_law(fixture, num_drafts):
    """Exact law of select_greedy_path over K i.i.d. drafted paths (V = 3, L = 2) equals Q̃ of
    SkewedPathLaw at every prefix z; Σ_x Q̃(z, x) = Q̃(z) before normalising (§14.5 item 5)."""
    target, draft = FIXTURES[fixture]()
    length, sampler = 2, paths_sampler(num_drafts, 2)

    def program(rng):
        skeleton = sampler(rng, draft)
        tree = skeleton.with_target(np.stack([target(z) for z in skeleton.prefixes]))
        return tree.tokens_to(select_greedy_path(tree)[-1])

    selected = enumerate_outcomes(program)
    assert sum(selected.values()) == pytest.approx(1.0, abs=1e-12)
    for depth in range(length + 1):
        marginal: dict = {}
        for path, prob in selected.items():
            marginal[path[:depth]] = marginal.get(path[:depth], 0.0) + prob
        for prefix in itertools.product(range(3), repeat=depth):
            full = prefix + (0,) * (length - depth)  # any continuation: only rows 0..depth are read
            law = _path_law(target, draft, full, num_drafts)
            assert marginal.get(prefix, 0.0) == pytest.approx(law.joint[depth], abs=1e-12), prefix
            if depth < length:
                row = law.joint_row(depth)
                assert row.sum() == pytest.approx(law.joint[depth], rel=1e-12, abs=1e-15), prefix
                if law.joint[depth] > 0:
                    assert law[depth].sum() == pytest.approx(1.0, abs=1e-12)
                    # the entries read on a support (issue 16) are the dense row's floats
                    everything = np.arange(3)
                    assert np.array_equal(law.gather(depth, everything), law[depth]), prefix
                    assert np.array_equal(law.gather(depth, everything[::2]), law[depth][::2]), prefix


@pytest.mark.parametrize("num_drafts", [2, 3])
@pytest.mark.parametrize("fixture", list(FIXTURES))
@pytest.mark.parametrize("verifier", [GreedyMultiPathBV(), SpecTrGBVStar()], ids=lambda v: v.name)
def test_rules_are_exact_with_tied_ratios(verifier, fixture, num_drafts):
    target, draft = FIXTURES[fixture]()
    error, _ = block_error(verifier, paths_sampler(num_drafts, 2), target, draft, 3)
    assert error < EXACT_TOLERANCE


@pytest.mark.parametrize("fixture", ["p_equals_q", "two_tied_ratios"])
def test_star_is_exact_over_iterations_with_tied_ratios(fixture):
    """The modification window carries the same order (SkewedDraftJoint): 4 tokens, 2+ rounds."""
    target, draft = FIXTURES[fixture]()
    assert generation_error(SpecTrGBVStar(), paths_sampler(2, 2), target, draft, 4) < EXACT_TOLERANCE
