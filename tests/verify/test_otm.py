"""OTM linear-programming reference (ALGORITHMS.md §10): LP = min-cut closed form, the §14.4
test vectors (i.i.d. and without replacement), the orderings of §10, the verifier built on the
plan (exact per block), the size guard, and edge cases."""

import numpy as np
import pytest

from tests.conftest import toy_pair
from tests.verify.conftest import random_pair, single_position_acceptance
from tests.verify.exact import EXACT_TOLERANCE, block_error, paths_sampler
from verispec.core.rng import SeededRng, enumerate_outcomes
from verispec.core.tree import DraftTree
from verispec.errors import ConfigError, UnsupportedDraftSchemeError
from verispec.models.toy import context_free_pair
from verispec.theory.enumerate import block_law
from verispec.verify.otm import (
    OTM,
    OTMPlanCache,
    iid_joint,
    otm_iid_acceptance_closed_form,
    otm_plan,
    otm_step,
    without_replacement_joint,
)
from verispec.verify.rrs import rrs_acceptance
from verispec.verify.spectr import kseq_acceptance

P_VEC = np.array([0.1, 0.6, 0.3])
Q_VEC = np.array([0.5, 0.3, 0.2])


def test_otm_test_vectors():
    iid = otm_plan(P_VEC, iid_joint(Q_VEC, 2))
    assert iid.acceptance == pytest.approx(0.85, abs=1e-9)
    assert otm_iid_acceptance_closed_form(P_VEC, Q_VEC, 2) == pytest.approx(0.85, abs=1e-12)
    accepted, first = single_position_acceptance(OTM(plan_cache=OTMPlanCache()), paths_sampler(2, 1), P_VEC, Q_VEC)
    assert accepted == pytest.approx(0.85, abs=1e-9)
    assert [first.get(x, 0.0) for x in range(3)] == pytest.approx(list(P_VEC), abs=1e-12)
    assert otm_plan(P_VEC, without_replacement_joint(Q_VEC, 2)).acceptance == pytest.approx(1.0, abs=1e-9)


def test_without_replacement_plan_is_lossless_and_accepts_everything():
    plan = otm_plan(P_VEC, without_replacement_joint(Q_VEC, 2))

    def program(rng):
        first = rng.categorical(Q_VEC)
        rest = Q_VEC.copy()
        rest[first] = 0.0
        pair = (first, rng.categorical(rest / rest.sum()))
        index, residual, _ = otm_step(rng, plan, pair)
        return ("accept", pair[index]) if index is not None else ("reject", rng.categorical(residual))

    law = enumerate_outcomes(program)
    assert sum(prob for (kind, _), prob in law.items() if kind == "accept") == pytest.approx(1.0, abs=1e-9)
    emitted = np.zeros(3)
    for (_, token), prob in law.items():
        emitted[token] += prob
    assert np.max(np.abs(emitted - P_VEC)) < EXACT_TOLERANCE


def test_joints_are_laws():
    _, draft = random_pair(4, 1)
    for k in (1, 2, 3):
        assert iid_joint(draft, k).sum() == pytest.approx(1.0, abs=1e-14)
    for k in (2, 3):
        joint = without_replacement_joint(Q_VEC, k)
        assert joint.sum() == pytest.approx(1.0, abs=1e-14)
        assert np.all(np.diagonal(joint, axis1=0, axis2=1) == 0.0)
    with pytest.raises(ConfigError, match="fewer than k = 3"):
        without_replacement_joint(np.array([0.5, 0.5, 0.0]), 3)


@pytest.mark.parametrize("vocab,k,seed", [(3, 1, 0), (3, 2, 1), (3, 3, 2), (4, 2, 3), (4, 3, 4), (5, 2, 5), (5, 3, 6)])
def test_lp_equals_min_cut_and_plan_is_feasible(vocab, k, seed):
    target, draft = random_pair(vocab, seed)
    plan = otm_plan(target, iid_joint(draft, k))
    assert plan.acceptance == pytest.approx(otm_iid_acceptance_closed_form(target, draft, k), abs=1e-8)
    pi = plan.pi_matrix()
    assert np.all(pi >= 0.0)
    assert np.all(pi.sum(axis=1) <= plan.joint * (1 + 1e-15))
    assert np.all(pi.sum(axis=0) <= target * (1 + 1e-15))


@pytest.mark.parametrize("vocab,k,seed", [(3, 2, 10), (4, 2, 11), (4, 3, 12), (5, 2, 13), (5, 3, 14), (6, 2, 15)])
def test_orderings(vocab, k, seed):
    """RRS <= K-SEQ <= OTM(i.i.d.) <= OTM(without replacement); only K-SEQ <= OTM(i.i.d.) is a
    theorem (OTM is optimal for i.i.d. drafts), the others are observed (§10)."""
    target, draft = random_pair(vocab, seed, zero_frac=0.0)
    rrs, kseq = rrs_acceptance(target, draft, k), kseq_acceptance(target, draft, k)
    otm_iid = otm_iid_acceptance_closed_form(target, draft, k)
    otm_wor = otm_plan(target, without_replacement_joint(draft, k)).acceptance
    assert rrs <= kseq + 1e-12
    assert kseq <= otm_iid + 1e-12
    assert otm_iid <= otm_wor + 1e-8
    assert kseq >= (1 - 1 / np.e) * otm_iid - 1e-12


@pytest.mark.parametrize("vocab,length,num_drafts", [(3, 2, 1), (3, 2, 2), (3, 2, 3), (4, 2, 2), (3, 3, 2)])
def test_otm_verifier_is_exact_per_block(vocab, length, num_drafts):
    target, draft = toy_pair(vocab, seed=vocab * 100 + length * 10 + num_drafts)
    error, _ = block_error(OTM(plan_cache=OTMPlanCache()), paths_sampler(num_drafts, length), target, draft, length + 1)
    assert error < EXACT_TOLERANCE


def test_identical_models_accept_everything():
    target, _ = toy_pair(3, seed=9)
    law = block_law(OTM(plan_cache=OTMPlanCache()), paths_sampler(2, 2), target, target)
    assert law.expected_accepted_len == pytest.approx(2.0, abs=1e-9)


def test_disjoint_supports_reject_everything_and_emit_the_target():
    target, draft = context_free_pair([0.5, 0.5, 0.0, 0.0], [0.0, 0.0, 0.4, 0.6])
    law = block_law(OTM(plan_cache=OTMPlanCache()), paths_sampler(2, 2), target, draft)
    assert law.expected_accepted_len == 0.0
    assert law.probs == pytest.approx({(0,): 0.5, (1,): 0.5}, abs=1e-12)


def test_size_guards():
    vocab = 200
    target = np.full(vocab, 1.0 / vocab)
    with pytest.raises(ConfigError, match=r"OTM is an exponential reference; use V\^K <= 20000"):
        otm_plan(target, iid_joint(target, 2))
    with pytest.raises(ConfigError, match="use V <= 12"):
        otm_iid_acceptance_closed_form(np.full(13, 1 / 13), np.full(13, 1 / 13), 2)
    tree = DraftTree.build(
        [-1, 0, 1], [-1, 0, 0], np.tile(target, (3, 1)), np.vstack([target, np.zeros((2, vocab))]),
        "iid_paths", paths=[(1,), (2,)],
    )
    with pytest.raises(ConfigError, match="exponential reference"):
        OTM().verify(tree, SeededRng(0))


def test_otm_refuses_iid_trees():
    target, draft = toy_pair(3, seed=1)
    skeleton = paths_sampler(2, 2, merge=False)(SeededRng(0), draft)
    tree = skeleton.with_target([target(prefix) for prefix in skeleton.prefixes])
    with pytest.raises(UnsupportedDraftSchemeError, match="'otm'"):
        OTM().verify(tree, SeededRng(0))


def test_otm_keeps_no_state_between_calls_unless_given_a_cache():
    """The registry's shared OTM instance must not grow a process-wide cache (DESIGN.md §6):
    without a cache argument nothing survives a call; a caller-owned cache is bounded and reused."""
    from verispec.verify.registry import METHODS

    target, draft = toy_pair(3, seed=5)
    skeleton = paths_sampler(2, 2)(SeededRng(3), draft)
    tree = skeleton.with_target([target(prefix) for prefix in skeleton.prefixes])
    shared = METHODS["otm"].verifier
    before = dict(vars(shared))
    first = shared.verify(tree, SeededRng(9))
    assert dict(vars(shared)) == before and shared.plan_cache is None
    cache = OTMPlanCache(max_plans=2)
    owned = OTM(plan_cache=cache)
    assert owned.verify(tree, SeededRng(9)) == first  # same plans, same draws, same output
    assert 1 <= len(cache) <= 2
    with pytest.raises(ConfigError, match="max_plans >= 1"):
        OTMPlanCache(0)
