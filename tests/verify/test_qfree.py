"""q-free verification of deterministic candidate trees (ALGORITHMS.md §13; issue 12): exact at any
temperature on trees with 1-3 children per node, depth 3, exact zeros and ties; acceptance = the
target mass of the children; the lazy walk reads only the rows it visits; and the negative
controls: q-based rules fed a deterministic tree with a q they would divide by are NOT exact."""

from dataclasses import replace

import numpy as np
import pytest

from tests.conftest import toy_pair
from tests.verify.exact import EXACT_TOLERANCE, block_error, tree_sampler
from verispec.core.rng import SeededRng
from verispec.core.rows import DenseRows
from verispec.core.tree import DraftScheme, DraftTree
from verispec.errors import UnsupportedDraftSchemeError
from verispec.models.toy import context_free_pair
from verispec.theory.enumerate import block_law
from verispec.verify.qfree import QFreeTreeVerification, qfree_walk
from verispec.verify.registry import METHODS, get_method
from verispec.verify.rrs import RRSw
from verispec.verify.sd import SpeculativeSampling
from verispec.core.rows import DenseRows

DETERMINISTIC = DraftScheme.DETERMINISTIC
# (name, V, shape): per-depth widths or nested shapes with 1-3 children per node, depth 3
SHAPES = [
    ("chain-3", 4, [1, 1, 1]),
    ("3-2-1", 4, [3, 2, 1]),
    ("1-3-2", 4, [1, 3, 2]),
    ("2-2-2", 3, [2, 2, 2]),
    ("irregular", 4, (((), ((),)), ((), (), ((), (), ())), ((),))),
]


@pytest.mark.parametrize("vocab,shape", [c[1:] for c in SHAPES], ids=[c[0] for c in SHAPES])
@pytest.mark.parametrize("seed", [1, 2])
def test_qfree_is_exact_on_deterministic_trees_with_zeros(vocab, shape, seed):
    target, draft = toy_pair(vocab, seed=300 + seed, zero_frac=0.3)
    error, law = block_error(QFreeTreeVerification(), tree_sampler(shape, DETERMINISTIC), target, draft, 4)
    assert error < EXACT_TOLERANCE
    assert law.expected_accepted_len > 0.0  # the trees are informative: something is accepted


def test_qfree_is_exact_with_ties_in_target_and_candidates():
    # ties everywhere: equal target probabilities, equal candidate scores (lowest id first)
    target, draft = context_free_pair([0.25, 0.25, 0.25, 0.25, 0.0], [0.3, 0.3, 0.2, 0.2, 0.0])
    error, law = block_error(QFreeTreeVerification(), tree_sampler([3, 2, 1], DETERMINISTIC), target, draft, 4)
    assert error < EXACT_TOLERANCE
    # root: children {0,1,2} carry 0.75; then children {0,1}: 0.5; then {0}: 0.25
    assert law.expected_accepted_len == pytest.approx(0.75 + 0.75 * 0.5 + 0.75 * 0.5 * 0.25, abs=1e-15)


def test_acceptance_is_the_target_mass_of_the_children_including_zero_mass_candidates():
    target, draft = context_free_pair([0.0, 0.5, 0.3, 0.2], [0.6, 0.1, 0.3, 0.0])  # top-q child 0 has p = 0
    law = block_law(QFreeTreeVerification(), tree_sampler([2], DETERMINISTIC), target, draft)
    assert law.expected_accepted_len == pytest.approx(0.0 + 0.3, abs=1e-15)
    assert sum(prob for out, prob in law.probs.items() if out[0] == 2 and len(out) == 2) == pytest.approx(0.3)
    assert law.probs[(1,)] == pytest.approx(0.5) and law.probs[(3,)] == pytest.approx(0.2)


def test_lazy_walk_reads_only_the_rows_it_visits():
    rows = np.array([[0.0, 1.0, 0.0], [0.0, 0.0, 1.0], [1.0, 0.0, 0.0], [0.2, 0.3, 0.5]])
    children = {0: {1: 1, 2: 3}, 1: {2: 2}, 2: {}, 3: {}}  # root -> 1 -> 2 ; root -> 3 (token 2)
    read = []

    class RecordingRows(DenseRows):
        """Records the nodes whose rows are read, in first-read order, whatever the read."""

        def _note(self, nodes):
            read.extend(n for n in dict.fromkeys(int(n) for n in nodes) if n not in read)

        def row(self, node):
            self._note([node])
            return super().row(node)

        def probs_of(self, nodes, tokens):
            self._note(nodes)
            return super().probs_of(nodes, tokens)

        def support(self, node):
            self._note([node])
            return super().support(node)

        def gather(self, node, ids):
            self._note([node])
            return super().gather(node, ids)

    visited, token, is_bonus, _ = qfree_walk(children.__getitem__, RecordingRows(rows), SeededRng(0))
    assert visited == [0, 1, 2] and token == 0 and is_bonus
    assert read == [0, 1, 2]  # node 3's row was never asked for


def test_registry_entry_draws_deterministic_trees():
    spec = get_method("qfree")
    assert spec.lossless and spec.draft == "tree" and spec.tree_scheme is DETERMINISTIC
    assert DETERMINISTIC in spec.verifier.supported_schemes


@pytest.mark.parametrize("name", [n for n, s in METHODS.items() if n not in ("nss", "qfree")])
def test_rules_that_read_q_refuse_deterministic_trees(name):
    target = np.tile([0.5, 0.5], (2, 1))
    draft = np.array([[1.0, 0.0], [0.0, 0.0]])
    tree = DraftTree.build([-1, 0], [-1, 0], target, draft, DETERMINISTIC)
    with pytest.raises(UnsupportedDraftSchemeError, match="'deterministic'"):
        METHODS[name].verifier.verify(tree, SeededRng(0))


def _forced(shape, scheme, fake_q=None):
    """Negative-control sampler: deterministic top-q children, relabelled ``scheme`` so a q-based
    rule accepts them; its q rows are the draft's own (what the rule would divide by) or
    ``fake_q(children tokens, V)``."""
    sample = tree_sampler(shape, DETERMINISTIC)

    def sampler(rng, draft_fn):
        skeleton = sample(rng, draft_fn)
        probs = np.array(skeleton.draft_probs)
        if fake_q is not None:
            for node in range(skeleton.num_nodes):
                kids = [skeleton.tokens[c] for c in range(skeleton.num_nodes) if skeleton.parents[c] == node]
                if kids:
                    probs[node] = fake_q(kids, probs.shape[1])
        paths = (tuple(range(1, skeleton.num_nodes)),) if scheme is DraftScheme.CHAIN else ()
        return replace(skeleton, draft=DenseRows(probs), scheme=scheme, paths=paths)

    return sampler


def _uniform_over(kids, vocab):
    row = np.zeros(vocab)
    row[kids] = 1.0 / len(kids)
    return row


NEGATIVE_CONTROLS = [
    ("sd-on-top1-chain", SpeculativeSampling(), _forced([1, 1], DraftScheme.CHAIN)),
    ("rrsw-on-topk-tree", RRSw(), _forced([2, 2], DraftScheme.WITHOUT_REPLACEMENT)),
    ("rrsw-uniform-fake-q", RRSw(), _forced([2, 2], DraftScheme.WITHOUT_REPLACEMENT, _uniform_over)),
]


@pytest.mark.parametrize("verifier,sampler", [c[1:] for c in NEGATIVE_CONTROLS], ids=[c[0] for c in NEGATIVE_CONTROLS])
def test_negative_control_q_based_rules_on_deterministic_candidates_are_not_exact(verifier, sampler):
    target, draft = toy_pair(4, seed=311, zero_frac=0.2)
    error, _ = block_error(verifier, sampler, target, draft, 3)
    assert error > 1e-3  # the exactness test catches them
    error, _ = block_error(QFreeTreeVerification(), tree_sampler([2, 2], DETERMINISTIC), target, draft, 3)
    assert error < EXACT_TOLERANCE  # same models, q-free: exact


def test_one_hot_q_on_a_chain_is_equal_in_law_to_the_qfree_walk():
    """The issue's "equal in law" reading: SD with q = one-hot at each deterministic token accepts
    with p(x) and resamples from the renormalised rest, which is the q-free walk on a chain."""
    target, draft = toy_pair(4, seed=312, zero_frac=0.2)
    one_hot = _forced([1, 1], DraftScheme.CHAIN, lambda kids, vocab: np.eye(vocab)[kids[0]])
    sd_law = block_law(SpeculativeSampling(), one_hot, target, draft)
    qfree_law = block_law(QFreeTreeVerification(), tree_sampler([1, 1], DETERMINISTIC), target, draft)
    assert set(sd_law.probs) == set(qfree_law.probs)
    assert max(abs(sd_law.probs[k] - qfree_law.probs[k]) for k in sd_law.probs) < EXACT_TOLERANCE
