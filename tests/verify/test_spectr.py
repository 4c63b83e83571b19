"""SpecTr K-SEQ (ALGORITHMS.md §5, §14.5 item 3): exactness by enumeration, the root rho* from
the f >= 0 side, the acceptance closed form, K = 1 = SD, edge cases, the wrong-side-rho negative
control, and a Monte-Carlo chi-square test at K = 4."""

import numpy as np
import pytest

from tests.conftest import toy_pair
from tests.verify.conftest import random_pair, single_position_acceptance
from tests.verify.exact import EXACT_TOLERANCE, block_error, paths_sampler, tree_sampler
from verispec.core.rng import SeededRng, enumerate_outcomes
from verispec.core.tree import DraftScheme
from verispec.errors import UnsupportedDraftSchemeError
from verispec.models.toy import context_free_pair
from verispec.theory.enumerate import block_law
from verispec.verify.sd import SpeculativeSampling
from verispec.verify.spectr import (
    SpecTr,
    SpecTrWrongSideRho,
    kseq_acceptance,
    kseq_beta,
    kseq_f,
    kseq_rho,
    kseq_rho_bracket,
    kseq_step,
)

P_VEC = np.array([0.1, 0.6, 0.3])
Q_VEC = np.array([0.5, 0.3, 0.2])


# ----- §14.4 test vector --------------------------------------------------------------------------


def test_kseq_test_vector():
    rho = kseq_rho(P_VEC, Q_VEC, 2)
    assert rho == pytest.approx(1.430074, abs=1e-6)
    assert kseq_acceptance(P_VEC, Q_VEC, 2) == pytest.approx(0.815037, abs=1e-6)
    accepted, first_token = single_position_acceptance(SpecTr(), paths_sampler(2, 1), P_VEC, Q_VEC)
    assert accepted == pytest.approx(kseq_acceptance(P_VEC, Q_VEC, 2), abs=1e-12)
    assert accepted == pytest.approx(0.815037, abs=1e-6)
    assert [first_token.get(x, 0.0) for x in range(3)] == pytest.approx(list(P_VEC), abs=1e-15)


# ----- rho* ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(40))
def test_rho_is_the_smallest_root_from_the_nonnegative_side(seed):
    vocab, k = 3 + seed % 5, 2 + seed % 4
    target, draft = random_pair(vocab, seed)
    rho = kseq_rho(target, draft, k)
    assert 1.0 <= rho <= k
    if kseq_beta(target, draft, 1.0) > 0.0:
        assert kseq_f(target, draft, rho, k) >= 0.0
    if rho > 1.0:
        assert kseq_f(target, draft, rho * (1.0 - 1e-9), k) < 0.0  # nothing much smaller works
        assert rho == pytest.approx(kseq_rho_bracket(target, draft, k)[1], rel=1e-12)


def test_rho_on_a_large_peaked_vocabulary_matches_plain_bisection():
    rng = np.random.default_rng(0)
    logits = 3.0 * rng.standard_normal(50_000)
    target = np.exp(logits - logits.max())
    target /= target.sum()
    for noise, k in [(0.3, 2), (1.0, 4), (3.0, 3)]:
        draft = np.exp(logits + noise * 3.0 * rng.standard_normal(50_000))
        draft /= draft.sum()
        rho = kseq_rho(target, draft, k)
        assert kseq_f(target, draft, rho, k) >= 0.0
        assert rho == pytest.approx(kseq_rho_bracket(target, draft, k)[1], rel=1e-12)


def test_rho_degenerate_cases():
    assert kseq_rho(P_VEC, Q_VEC, 1) == 1.0
    assert kseq_rho(P_VEC, P_VEC, 4) == 1.0  # p = q: f(1) = 0
    disjoint_p, disjoint_q = np.array([0.5, 0.5, 0.0, 0.0]), np.array([0.0, 0.0, 0.3, 0.7])
    assert kseq_rho(disjoint_p, disjoint_q, 3) == 1.0  # beta = 0 for every rho
    assert kseq_rho_bracket(P_VEC, Q_VEC, 2, 60)[0] < kseq_rho(P_VEC, Q_VEC, 2)


def test_f_is_nondecreasing():
    target, draft = random_pair(6, 3)
    values = [kseq_f(target, draft, rho, 4) for rho in np.linspace(1.0, 4.0, 200)]
    assert np.all(np.diff(values) >= -1e-15)
    assert values[0] <= 0.0 <= values[-1]


# ----- closed form vs enumeration -----------------------------------------------------------------


@pytest.mark.parametrize(
    "vocab,k,seed", [(3, 1, 0), (3, 2, 1), (3, 4, 2), (4, 2, 3), (4, 3, 4), (5, 2, 5), (5, 3, 6), (6, 2, 7), (6, 4, 8)]
)
def test_single_position_acceptance_closed_form(vocab, k, seed):
    target, draft = random_pair(vocab, seed)
    accepted, first_token = single_position_acceptance(SpecTr(), paths_sampler(k, 1), target, draft)
    assert accepted == pytest.approx(kseq_acceptance(target, draft, k), abs=1e-9)
    assert max(abs(first_token.get(x, 0.0) - target[x]) for x in range(vocab)) < EXACT_TOLERANCE


def test_kseq_step_output_law_is_the_target():
    target, draft = random_pair(5, 11)

    def program(rng):
        candidates = [rng.categorical(draft) for _ in range(3)]
        token, residual = kseq_step(rng, target, draft, candidates)
        return token if token is not None else rng.categorical(residual)

    law = enumerate_outcomes(program)
    assert max(abs(law.get(x, 0.0) - target[x]) for x in range(5)) < EXACT_TOLERANCE


# ----- exactness on toy models ------------------------------------------------------------------------


@pytest.mark.parametrize("vocab,length,num_drafts", [(3, 2, 1), (3, 2, 2), (3, 2, 3), (4, 2, 2), (3, 3, 2), (4, 3, 1)])
def test_spectr_is_exact_per_block(vocab, length, num_drafts):
    target, draft = toy_pair(vocab, seed=vocab * 100 + length * 10 + num_drafts)
    error, _ = block_error(SpecTr(), paths_sampler(num_drafts, length), target, draft, length + 1)
    assert error < EXACT_TOLERANCE


def test_spectr_with_one_draft_is_sd():
    target, draft = toy_pair(4, seed=5)
    spectr = block_law(SpecTr(), paths_sampler(1, 3), target, draft).probs
    sd = block_law(SpeculativeSampling(), paths_sampler(1, 3), target, draft).probs
    assert set(spectr) == set(sd)
    assert max(abs(spectr[key] - sd[key]) for key in sd) < 1e-12


@pytest.mark.parametrize("num_drafts,length", [(2, 2), (3, 2)])
def test_wrong_side_rho_is_detected(num_drafts, length):
    """Negative control (§14.2): rho below the root with the root-form residual."""
    # no exact zeros: a draft that vanishes on the residual's support can hide the error
    target, draft = toy_pair(3, seed=301 + 10 * length + num_drafts, zero_frac=0.0)
    assert not SpecTrWrongSideRho.lossless
    error, _ = block_error(SpecTrWrongSideRho(), paths_sampler(num_drafts, length), target, draft, length + 1)
    assert error > 1e-3


# ----- edge cases (§14.3) -------------------------------------------------------------------------------


def test_identical_models_accept_everything():
    target, _ = toy_pair(4, seed=9)
    law = block_law(SpecTr(), paths_sampler(3, 2), target, target)
    assert law.expected_accepted_len == pytest.approx(2.0, abs=1e-12)


def test_disjoint_supports_reject_everything_and_emit_the_target():
    target, draft = context_free_pair([0.5, 0.5, 0.0, 0.0], [0.0, 0.0, 0.4, 0.6])
    law = block_law(SpecTr(), paths_sampler(3, 2), target, draft)
    assert law.expected_accepted_len == 0.0
    assert law.probs == pytest.approx({(0,): 0.5, (1,): 0.5}, abs=1e-15)


@pytest.mark.parametrize(
    "target_vec,draft_vec",
    [
        ([0.2, 0.5, 0.3], [1.0, 0.0, 0.0]),  # point-mass draft, candidates all equal
        ([0.0, 0.5, 0.5], [1.0, 0.0, 0.0]),  # point mass on a token with p = 0: beta = 0
        ([0.0, 0.7, 0.3], [0.5, 0.25, 0.25]),  # p = 0 on a drafted token
    ],
)
def test_edge_distributions_are_exact(target_vec, draft_vec):
    target, draft = context_free_pair(target_vec, draft_vec)
    for num_drafts in (2, 3):
        error, law = block_error(SpecTr(), paths_sampler(num_drafts, 2), target, draft, 3)
        assert error < EXACT_TOLERANCE
    accepted, _ = single_position_acceptance(SpecTr(), paths_sampler(3, 1), np.array(target_vec), np.array(draft_vec))
    assert accepted == pytest.approx(kseq_acceptance(np.array(target_vec), np.array(draft_vec), 3), abs=1e-12)


def test_spectr_refuses_trees_that_are_not_iid_paths():
    target, draft = toy_pair(3, seed=1)
    skeleton = tree_sampler([2, 1], DraftScheme.WITHOUT_REPLACEMENT)(SeededRng(0), draft)
    tree = skeleton.with_target([target(prefix) for prefix in skeleton.prefixes])
    with pytest.raises(UnsupportedDraftSchemeError, match="'spectr'"):
        SpecTr().verify(tree, SeededRng(0))


# Monte-Carlo at K = 4 with a stated power: tests/verify/test_monte_carlo.py
