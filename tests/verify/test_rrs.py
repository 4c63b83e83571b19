"""RRS / RRSw (ALGORITHMS.md §8, §14.5 item 6): the single-node rule and its closed form, tries
with the raw candidate list (RRS) and distinct children (RRSw), i.i.d. and without-replacement
trees, the deduplication negative control, edge cases, and Monte-Carlo chi-square at K = 4."""

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
from verispec.verify.rrs import RRS, RRSDeduplicated, RRSw, recursive_rejection, rrs_acceptance
from verispec.verify.sd import SpeculativeSampling

P_VEC = np.array([0.1, 0.6, 0.3])
Q_VEC = np.array([0.5, 0.3, 0.2])


# ----- §14.4 test vectors -------------------------------------------------------------------------


def test_rrs_and_rrsw_test_vectors():
    assert rrs_acceptance(P_VEC, Q_VEC, 2) == pytest.approx(0.80, abs=1e-12)
    accepted, first = single_position_acceptance(RRS(), paths_sampler(2, 1), P_VEC, Q_VEC)
    assert accepted == pytest.approx(0.80, abs=1e-12)
    assert [first.get(x, 0.0) for x in range(3)] == pytest.approx(list(P_VEC), abs=1e-15)
    accepted, first = single_position_acceptance(
        RRSw(), tree_sampler([2], DraftScheme.WITHOUT_REPLACEMENT), P_VEC, Q_VEC
    )
    assert accepted == pytest.approx(0.94, abs=1e-12)
    assert [first.get(x, 0.0) for x in range(3)] == pytest.approx(list(P_VEC), abs=1e-15)


# ----- single node ------------------------------------------------------------------------------------


def _single_node_program(target, draft, count, without_replacement):
    """Draw ``count`` candidates (i.i.d., or without replacement with support exhaustion), run
    §8.1 and return the emitted token."""

    def program(rng):
        candidates, remaining = [], draft.copy()
        for _ in range(count):
            if without_replacement:
                if remaining.sum() <= 0.0:
                    break
                token = rng.categorical(remaining / remaining.sum())
                remaining[token] = 0.0
            else:
                token = rng.categorical(draft)
            candidates.append(token)
        index, residual = recursive_rejection(rng, target, draft, candidates, without_replacement)
        return ("accept", candidates[index]) if index is not None else ("reject", rng.categorical(residual))

    return program


@pytest.mark.parametrize(
    "vocab,count,seed", [(3, 1, 0), (3, 2, 1), (3, 4, 2), (4, 2, 3), (4, 3, 4), (5, 2, 5), (5, 4, 6), (6, 3, 7), (6, 4, 8)]
)
@pytest.mark.parametrize("without_replacement", [False, True], ids=["rrs", "rrsw"])
def test_single_node_is_exact_and_rrs_matches_its_closed_form(vocab, count, seed, without_replacement):
    target, draft = random_pair(vocab, seed)
    law = enumerate_outcomes(_single_node_program(target, draft, count, without_replacement))
    emitted = np.zeros(vocab)
    for (_, token), prob in law.items():
        emitted[token] += prob
    assert np.max(np.abs(emitted - target)) < EXACT_TOLERANCE
    accepted = sum(prob for (kind, _), prob in law.items() if kind == "accept")
    if not without_replacement:
        assert accepted == pytest.approx(rrs_acceptance(target, draft, count), abs=1e-9)


def test_rrsw_support_exhaustion():
    """q has two tokens in its support and three candidates are asked for: the draw stops."""
    target, draft = np.array([0.2, 0.3, 0.5]), np.array([0.7, 0.3, 0.0])
    law = enumerate_outcomes(_single_node_program(target, draft, 3, True))
    emitted = np.zeros(3)
    for (_, token), prob in law.items():
        emitted[token] += prob
    assert np.max(np.abs(emitted - target)) < EXACT_TOLERANCE
    tree_target, tree_draft = context_free_pair(target, draft)
    error, _ = block_error(RRSw(), tree_sampler([3, 3], DraftScheme.WITHOUT_REPLACEMENT), tree_target, tree_draft, 3)
    assert error < EXACT_TOLERANCE


class _AlwaysReject:
    """An Rng that rejects every candidate whose acceptance is below 1."""

    def bernoulli(self, prob):
        return prob >= 1.0

    def categorical(self, probs):  # pragma: no cover - unused
        return int(np.argmax(probs))


def test_rrs_duplicates_are_separate_candidates():
    # a duplicate of a rejected token is rejected but still updates the target: with 3 copies
    # of the same candidate the acceptance is the closed form, not that of one candidate
    target, draft = np.array([0.2, 0.8]), np.array([0.9, 0.1])
    index, residual = recursive_rejection(_AlwaysReject(), target, draft, [0, 0, 0], without_replacement=False)
    assert index is None and residual == pytest.approx([0.0, 1.0])
    assert rrs_acceptance(target, draft, 3) > rrs_acceptance(target, draft, 1)


# ----- trees ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("vocab,length,num_drafts", [(3, 2, 1), (3, 2, 2), (3, 2, 3), (4, 2, 2), (3, 3, 2), (4, 3, 1)])
@pytest.mark.parametrize("verifier", [RRS(), RRSw()], ids=lambda v: v.name)
def test_rules_are_exact_on_iid_paths(verifier, vocab, length, num_drafts):
    target, draft = toy_pair(vocab, seed=vocab * 100 + length * 10 + num_drafts)
    error, _ = block_error(verifier, paths_sampler(num_drafts, length), target, draft, length + 1)
    assert error < EXACT_TOLERANCE


@pytest.mark.parametrize("vocab,shape", [(3, [2, 1]), (3, [3, 2]), (4, [2, 1]), (4, [2, 2]), (3, [1, 2, 1])])
def test_rrs_is_exact_on_iid_trees(vocab, shape):
    target, draft = toy_pair(vocab, seed=17 + vocab)
    error, _ = block_error(RRS(), tree_sampler(shape, DraftScheme.IID_TREE), target, draft, len(shape) + 1)
    assert error < EXACT_TOLERANCE


def test_rrs_is_exact_on_a_broom():
    target, draft = toy_pair(3, seed=33)
    error, _ = block_error(RRS(), paths_sampler(2, 2, merge=False), target, draft, 3)
    assert error < EXACT_TOLERANCE


@pytest.mark.parametrize("vocab,shape", [(3, [2, 1]), (3, [3, 2]), (4, [2, 1]), (4, [2, 2]), (4, [3, 1]), (3, [1, 2, 1])])
def test_rrsw_is_exact_on_without_replacement_trees(vocab, shape):
    target, draft = toy_pair(vocab, seed=23 + vocab)
    error, _ = block_error(RRSw(), tree_sampler(shape, DraftScheme.WITHOUT_REPLACEMENT), target, draft, len(shape) + 1)
    assert error < EXACT_TOLERANCE


@pytest.mark.parametrize("verifier", [RRS(), RRSw()], ids=lambda v: v.name)
def test_one_draft_is_sd(verifier):
    target, draft = toy_pair(4, seed=5)
    law = block_law(verifier, paths_sampler(1, 3), target, draft).probs
    sd = block_law(SpeculativeSampling(), paths_sampler(1, 3), target, draft).probs
    assert set(law) == set(sd)
    assert max(abs(law[key] - sd[key]) for key in sd) < 1e-12


@pytest.mark.parametrize("num_drafts,length", [(2, 2), (3, 2), (2, 3)])
def test_deduplicated_rrs_is_detected(num_drafts, length):
    """Negative control (§8.1 pitfall, §14.2): with-replacement formulas on distinct children."""
    # no exact zeros: a draft that vanishes on the residual's support can hide the error
    target, draft = toy_pair(3, seed=301 + 10 * length + num_drafts, zero_frac=0.0)
    assert not RRSDeduplicated.lossless
    error, _ = block_error(RRSDeduplicated(), paths_sampler(num_drafts, length), target, draft, length + 1)
    assert error > 1e-4


# ----- edge cases (§14.3) -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "verifier,sampler",
    [
        (RRS(), paths_sampler(3, 2)),
        (RRS(), tree_sampler([2, 2], DraftScheme.IID_TREE)),
        (RRSw(), paths_sampler(3, 2)),
        (RRSw(), tree_sampler([2, 2], DraftScheme.WITHOUT_REPLACEMENT)),
    ],
    ids=["rrs-paths", "rrs-tree", "rrsw-paths", "rrsw-tree"],
)
def test_identical_models_accept_everything(verifier, sampler):
    target, _ = toy_pair(4, seed=9)
    law = block_law(verifier, sampler, target, target)
    assert law.expected_accepted_len == pytest.approx(2.0, abs=1e-12)


@pytest.mark.parametrize("verifier", [RRS(), RRSw()], ids=lambda v: v.name)
def test_disjoint_supports_reject_everything_and_emit_the_target(verifier):
    target, draft = context_free_pair([0.5, 0.5, 0.0, 0.0], [0.0, 0.0, 0.4, 0.6])
    law = block_law(verifier, paths_sampler(3, 2), target, draft)
    assert law.expected_accepted_len == 0.0
    assert law.probs == pytest.approx({(0,): 0.5, (1,): 0.5}, abs=1e-15)


@pytest.mark.parametrize(
    "target_vec,draft_vec",
    [([0.2, 0.5, 0.3], [1.0, 0.0, 0.0]), ([0.0, 0.5, 0.5], [1.0, 0.0, 0.0]), ([0.0, 0.7, 0.3], [0.5, 0.25, 0.25])],
)
def test_edge_distributions_are_exact(target_vec, draft_vec):
    target, draft = context_free_pair(target_vec, draft_vec)
    cases = [
        (RRS(), paths_sampler(3, 2)),
        (RRSw(), paths_sampler(3, 2)),
        (RRSw(), tree_sampler([3, 2], DraftScheme.WITHOUT_REPLACEMENT)),  # support exhaustion
        (RRS(), tree_sampler([2, 2], DraftScheme.IID_TREE)),
    ]
    for verifier, sampler in cases:
        error, _ = block_error(verifier, sampler, target, draft, 3)
        assert error < EXACT_TOLERANCE, verifier.name


# ----- schemes -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "verifier,shape,scheme",
    [
        (RRS(), [2, 1], DraftScheme.WITHOUT_REPLACEMENT),
        (RRSw(), [2, 1], DraftScheme.IID_TREE),
        (RRSDeduplicated(), [2, 1], DraftScheme.IID_TREE),
        (RRS(), [2, 1], DraftScheme.SPECHUB_PAIR),
    ],
    ids=["rrs-wor", "rrsw-iid-tree", "dedup-iid-tree", "rrs-spechub"],
)
def test_wrong_scheme_is_refused(verifier, shape, scheme):
    target, draft = toy_pair(3, seed=1)
    skeleton = tree_sampler(shape, scheme)(SeededRng(0), draft)
    tree = skeleton.with_target([target(prefix) for prefix in skeleton.prefixes])
    with pytest.raises(UnsupportedDraftSchemeError, match=f"'{verifier.name}'"):
        verifier.verify(tree, SeededRng(0))


# Monte-Carlo at K = 4 with a stated power: tests/verify/test_monte_carlo.py
