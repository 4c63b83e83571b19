"""SpecHub (ALGORITHMS.md §9, §14.5 item 7): the pair sampler, transport masses, the acceptance
closed form = LP optimum for Q_hub, exactness on single nodes and binary trees, the degenerate
q(hub) = 1 path, the literal-pseudocode negative control, and a Monte-Carlo chi-square test."""

import numpy as np
import pytest

from tests.conftest import toy_pair
from tests.verify.conftest import random_pair, single_position_acceptance
from tests.verify.exact import EXACT_TOLERANCE, block_error, paths_sampler, tree_sampler
from verispec.core.rng import SeededRng, enumerate_outcomes
from verispec.core.tree import DraftScheme, DraftTree
from verispec.errors import InvalidDraftError, UnsupportedDraftSchemeError
from verispec.models.toy import context_free_pair
from verispec.theory.enumerate import block_law
from verispec.verify.otm import otm_plan
from verispec.verify.spechub import (
    SpecHub,
    SpecHubLiteral,
    sample_spechub_pair,
    spechub_acceptance,
    spechub_hub,
    spechub_joint,
    spechub_transport,
)

P_VEC = np.array([0.1, 0.6, 0.3])
Q_VEC = np.array([0.5, 0.3, 0.2])
PAIR = tree_sampler([2], DraftScheme.SPECHUB_PAIR)


def test_spechub_test_vector():
    assert spechub_acceptance(P_VEC, Q_VEC) == pytest.approx(1.0, abs=1e-12)
    accepted, first = single_position_acceptance(SpecHub(), PAIR, P_VEC, Q_VEC)
    assert accepted == pytest.approx(1.0, abs=1e-12)
    assert [first.get(x, 0.0) for x in range(3)] == pytest.approx(list(P_VEC), abs=1e-15)


def test_pair_sampler_draws_the_hub_joint():
    _, draft = random_pair(5, 3)
    law = enumerate_outcomes(lambda rng: sample_spechub_pair(rng, draft))
    joint = spechub_joint(draft)
    assert {pair: float(joint[pair]) for pair in law} == pytest.approx(law, abs=1e-15)
    assert sum(law.values()) == pytest.approx(1.0, abs=1e-15)
    assert all(spechub_hub(draft) in pair for pair in law)


def test_pair_sampler_point_mass_gives_the_hub_alone():
    assert sample_spechub_pair(SeededRng(0), np.array([0.0, 1.0, 0.0])) == (1,)
    # a float32-normalised point mass (q(hub) one ulp below 1, nothing elsewhere) is the same draft:
    # drawing x2 from the empty rest would be 0/0 (found by a lazy-row test with a top-p nucleus of one token)
    almost = np.array([0.0, float(np.float32(1.0) - np.finfo(np.float32).eps / 2), 0.0])
    assert all(sample_spechub_pair(SeededRng(seed), almost) == (1,) for seed in range(20))


@pytest.mark.parametrize("seed", range(12))
def test_transport_never_undersamples_the_hub(seed):
    target, draft = random_pair(3 + seed % 4, seed)
    if draft.max() >= 1.0:
        pytest.skip("degenerate draft")
    transport = spechub_transport(target, draft)
    hub = spechub_hub(draft)
    assert transport.R1 + transport.R2 >= target[hub] - 1e-15
    assert transport.A1 + transport.A2 == pytest.approx(target[hub], abs=1e-15)
    assert transport.pi1[hub] == transport.pi2[hub] == 0.0
    total = target[hub] + transport.pi1.sum() + transport.pi2.sum()
    assert total == pytest.approx(spechub_acceptance(target, draft), abs=1e-12)


@pytest.mark.parametrize("vocab,seed", [(3, 0), (3, 1), (4, 2), (4, 3), (5, 4), (5, 5), (6, 6), (6, 7)])
def test_single_node_acceptance_closed_form_and_lp(vocab, seed):
    target, draft = random_pair(vocab, seed)
    accepted, first = single_position_acceptance(SpecHub(), PAIR, target, draft)
    assert accepted == pytest.approx(spechub_acceptance(target, draft), abs=1e-9)
    assert max(abs(first.get(x, 0.0) - target[x]) for x in range(vocab)) < EXACT_TOLERANCE
    if draft.max() < 1.0:
        assert otm_plan(target, spechub_joint(draft)).acceptance == pytest.approx(accepted, abs=1e-8)


@pytest.mark.parametrize(
    "vocab,shape", [(3, [2]), (3, [2, 2]), (3, [2, 1, 2]), (3, [2, 2, 2]), (4, [2, 2]), (4, [1, 2]), (4, [2, 1, 2])]
)
def test_spechub_is_exact_on_binary_trees(vocab, shape):
    target, draft = toy_pair(vocab, seed=40 + vocab * 7 + len(shape))
    error, _ = block_error(SpecHub(), tree_sampler(shape, DraftScheme.SPECHUB_PAIR), target, draft, len(shape) + 1)
    assert error < EXACT_TOLERANCE


def test_unbalanced_binary_tree_is_exact():
    # a "binary Sequoia" shape: the first child has two children, the second one
    target, draft = toy_pair(3, seed=71)
    shape = (((), ()), ((),))
    error, _ = block_error(SpecHub(), tree_sampler(shape, DraftScheme.SPECHUB_PAIR), target, draft, 3)
    assert error < EXACT_TOLERANCE


@pytest.mark.parametrize(
    "vocab,shape,seed,zero_frac", [(3, [2], 56, 0.0), (3, [2, 2], 56, 0.0), (4, [2, 2], 54, 0.0), (4, [2, 2], 54, 0.25)]
)
def test_literal_pseudocode_is_detected(vocab, shape, seed, zero_frac):
    """Negative control (§9.4): p'(a) updated only in the x1 = a branch, r(a) = p(a). The two
    errors only matter on instances where those branches fire, so the toys are chosen where they
    do (on others, e.g. the §14.4 vector, the literal reading happens to be exact)."""
    target, draft = toy_pair(vocab, seed=seed, zero_frac=zero_frac)
    assert not SpecHubLiteral.lossless
    error, _ = block_error(SpecHubLiteral(), tree_sampler(shape, DraftScheme.SPECHUB_PAIR), target, draft, len(shape) + 1)
    assert error > 1e-2


def test_literal_pseudocode_oversamples_the_hub_by_hand():
    # hub a = 0, R1 = 0.3 = p(a) = A1, so the corrected A2 is 0; the literal reading accepts the
    # hub with probability min(p(a), R2)/R2 = 1 after rejecting x1 = 1 from the pair (1, a)
    target_vec, draft_vec = np.array([0.3, 0.1, 0.6]), np.array([0.5, 0.3, 0.2])
    transport = spechub_transport(target_vec, draft_vec)
    assert (transport.R1, transport.R2, transport.A1, transport.A2) == pytest.approx((0.3, 0.2, 0.3, 0.0))
    target, draft = context_free_pair(target_vec, draft_vec)
    error, law = block_error(SpecHubLiteral(), PAIR, target, draft, 2)
    hub_first = sum(prob for output, prob in law.probs.items() if output[0] == 0)
    assert hub_first == pytest.approx(0.3 + 0.2, abs=1e-12)  # 0.2 too much
    assert error > 0.1
    correct_error, _ = block_error(SpecHub(), PAIR, target, draft, 2)
    assert correct_error < EXACT_TOLERANCE


def test_degenerate_hub_is_plain_sd():
    target_vec, draft_vec = np.array([0.2, 0.5, 0.3]), np.array([1.0, 0.0, 0.0])
    target, draft = context_free_pair(target_vec, draft_vec)
    error, law = block_error(SpecHub(), tree_sampler([2, 2], DraftScheme.SPECHUB_PAIR), target, draft, 3)
    assert error < EXACT_TOLERANCE
    accepted, _ = single_position_acceptance(SpecHub(), PAIR, target_vec, draft_vec)
    assert accepted == pytest.approx(0.2, abs=1e-15) == pytest.approx(spechub_acceptance(target_vec, draft_vec))


@pytest.mark.parametrize(
    "target_vec,draft_vec",
    [([0.0, 0.7, 0.3], [0.5, 0.25, 0.25]), ([0.3, 0.0, 0.7], [0.6, 0.4, 0.0]), ([0.0, 0.5, 0.5], [0.9, 0.1, 0.0])],
)
def test_edge_distributions_are_exact(target_vec, draft_vec):
    target, draft = context_free_pair(target_vec, draft_vec)
    error, _ = block_error(SpecHub(), tree_sampler([2, 2], DraftScheme.SPECHUB_PAIR), target, draft, 3)
    assert error < EXACT_TOLERANCE


def test_residual_gives_the_hub_no_mass_when_p_hub_exceeds_q_hub_over_one_minus_q_hub():
    # hub a = 0 with p(a) = 0.9 > (1 + c) q(a) = 0.4/0.6: the positive-part formula of r would put
    # 0.23 on the hub, but r(a) = p(a) - A1 - A2 = 0 (§9.3); the residual branch fires with
    # probability p(3) - q(3)/(1 - q(a)) = 1/60. p vanishes on tokens 1 and 2, where q has 0.55.
    target_vec, draft_vec = np.array([0.9, 0.0, 0.0, 0.1]), np.array([0.4, 0.3, 0.25, 0.05])
    accepted, first = single_position_acceptance(SpecHub(), PAIR, target_vec, draft_vec)
    assert accepted == pytest.approx(spechub_acceptance(target_vec, draft_vec), abs=1e-12)
    assert 1.0 - accepted == pytest.approx(0.1 - 0.05 / 0.6, abs=1e-12)
    assert [first.get(x, 0.0) for x in range(4)] == pytest.approx(list(target_vec), abs=1e-15)
    target, draft = context_free_pair(target_vec, draft_vec)
    error, _ = block_error(SpecHub(), tree_sampler([2, 2], DraftScheme.SPECHUB_PAIR), target, draft, 3)
    assert error < EXACT_TOLERANCE


def test_identical_models_accept_everything():
    target, _ = toy_pair(4, seed=9)
    law = block_law(SpecHub(), tree_sampler([2, 2], DraftScheme.SPECHUB_PAIR), target, target)
    assert law.expected_accepted_len == pytest.approx(2.0, abs=1e-12)


def test_disjoint_supports_reject_everything_and_emit_the_target():
    target, draft = context_free_pair([0.5, 0.5, 0.0, 0.0], [0.0, 0.0, 0.4, 0.6])
    law = block_law(SpecHub(), tree_sampler([2, 2], DraftScheme.SPECHUB_PAIR), target, draft)
    assert law.expected_accepted_len == 0.0
    assert law.probs == pytest.approx({(0,): 0.5, (1,): 0.5}, abs=1e-15)


@pytest.mark.parametrize("make_skeleton", ["paths", "without_replacement"])
def test_spechub_refuses_other_schemes(make_skeleton):
    target, draft = toy_pair(3, seed=1)
    if make_skeleton == "paths":
        skeleton = paths_sampler(2, 2)(SeededRng(0), draft)
    else:
        skeleton = tree_sampler([2, 1], DraftScheme.WITHOUT_REPLACEMENT)(SeededRng(0), draft)
    tree = skeleton.with_target([target(prefix) for prefix in skeleton.prefixes])
    with pytest.raises(UnsupportedDraftSchemeError, match="'spechub'"):
        SpecHub().verify(tree, SeededRng(0))


def test_pair_without_the_hub_is_refused():
    # children (1, 2) under q = (0.5, 0.3, 0.2): the hub 0 is missing; p = 0 on both forces the
    # rejection branch, where the hub read off the pair is checked against argmax q
    target = np.tile([1.0, 0.0, 0.0], (3, 1))
    draft = np.array([[0.5, 0.3, 0.2], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    with pytest.raises(InvalidDraftError, match="hub argmax q = 0"):  # DraftTree.validate refuses it
        DraftTree.build([-1, 1, 2], [-1, 0, 0], target, draft, DraftScheme.SPECHUB_PAIR)
    # the engine builds trees unvalidated: the verifier checks the hub on its own
    tree = DraftTree.build([-1, 1, 2], [-1, 0, 0], target, draft, DraftScheme.SPECHUB_PAIR, validate=False)
    with pytest.raises(InvalidDraftError, match="the hub is 0"):
        SpecHub().verify(tree, SeededRng(0))


# Monte-Carlo with a stated power: tests/verify/test_monte_carlo.py
