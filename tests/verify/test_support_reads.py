"""What the chain and path rules READ from the row providers (issue 16): BV, NSS / q-free and
SpecTr work from entries, supports and gathers, never from full rows; BV at T = 0 stops reading
ratios at the first mismatch; the q-free walk gives the same output on lazy logit rows as on the
dense rows (same random numbers); BV's path function gives the same output on rows read through
a provider and on plain arrays.

What these catch: a rule that falls back to ``row()`` / ``dense()`` (O(V) per touched row: the
cost issue 16 removes) where the support suffices; BV reading every ratio of a rejected chain; a
q-free walk whose lazy path (supports, greedy shortcut) diverges from the dense rule.
Exactness itself is proven by the enumeration tests (test_block_rules, test_nss, test_qfree,
test_spectr, tests/core/test_rows.py); these check the reads and the lazy/dense agreement."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.conftest import toy_pair
from tests.verify.exact import paths_sampler, tree_sampler
from verispec.core.rng import SeededRng
from verispec.core.rows import DenseRows, LogitRows
from verispec.core.sampling import SamplingParams
from verispec.core.tree import DraftScheme, DraftTree
from verispec.verify.bv import BlockVerification, capped_weights, capped_weights_until_zero
from verispec.verify.nss import NaiveSpecInfer
from verispec.verify.qfree import QFreeTreeVerification
from verispec.verify.spectr import SpecTr


class RecordingRows(DenseRows):
    """DenseRows that records every read as (kind, node); its support is computed from the array
    (not through row(), so a row() read is always the rule's own)."""

    def __init__(self, probs, greedy: bool = False):
        super().__init__(probs, greedy=greedy)
        self.reads: list[tuple[str, int]] = []

    def row(self, node):
        self.reads.append(("row", int(node)))
        return super().row(node)

    def dense(self):
        self.reads.append(("dense", -1))
        return super().dense()

    def prob(self, node, token):
        self.reads.append(("entry", int(node)))
        return super().prob(node, token)

    def probs_of(self, nodes, tokens):
        self.reads.extend(("entry", int(node)) for node in nodes)
        return super().probs_of(nodes, tokens)

    def argmax(self, node):
        self.reads.append(("argmax", int(node)))
        return int(np.argmax(self.array[node]))

    def support(self, node):
        self.reads.append(("support", int(node)))
        ids = np.flatnonzero(self.array[node] > 0)
        return ids, self.array[node, ids]

    def gather(self, node, ids):
        self.reads.append(("gather", int(node)))
        return super().gather(node, ids)

    def kinds(self) -> set[str]:
        return {kind for kind, _ in self.reads}


def _recorded(tree: DraftTree, greedy: bool = False) -> DraftTree:
    return DraftTree.build(tree.tokens, tree.parents, RecordingRows(tree.target_probs, greedy=greedy),
                           RecordingRows(tree.draft_probs), tree.scheme, tree.paths, validate=False)


def _greedy_chain(length: int, vocab: int, mismatch: int) -> DraftTree:
    """A chain whose tokens are the target's argmax up to position ``mismatch`` (0-based), where
    the drafted token has p = 0; one-hot target rows, spread draft rows (q(x_i) > 0)."""
    rng = np.random.default_rng(5)
    argmax = rng.integers(0, vocab, size=length + 1)
    target = np.eye(vocab)[argmax]
    tokens = [int(argmax[i]) if i != mismatch else int((argmax[i] + 1) % vocab) for i in range(length)]
    draft = rng.dirichlet(np.ones(vocab), size=length)
    return DraftTree.chain(tokens, target, draft)


@pytest.mark.parametrize("mismatch,last_read", [(0, 1), (1, 1), (2, 5), (5, 5), (6, 13)])
def test_greedy_bv_reads_ratios_only_up_to_the_block_of_the_first_mismatch(mismatch, last_read):
    # blocks of positions [0, 2), [2, 6), [6, 14), [14, 16): reading stops after the block where
    # w first reaches 0, so a mismatch at position m touches the rows up to the end of its block
    tree = _recorded(_greedy_chain(16, 7, mismatch), greedy=True)
    result = BlockVerification().verify(tree, SeededRng(0))
    assert result.accepted_len == mismatch
    assert result.next_token == int(np.argmax(tree.target.array[mismatch]))
    for rows in (tree.target, tree.draft):
        nodes = {node for kind, node in rows.reads if kind == "entry"}
        assert nodes == set(range(last_read + 1)), rows.reads
    # point-mass rows: w is 0 or 1, so no rho, no residual row; the extra token is the argmax
    assert tree.target.kinds() <= {"entry", "argmax"} and tree.draft.kinds() == {"entry"}


def test_capped_weights_until_zero_reads_block_by_block_and_stops_after_a_zero():
    ratios = np.array([2.0, 0.5, 1.0, 0.0, 3.0, 1.0, 1.0, 1.0, 0.5])
    asked = []

    def ratio_block(start, stop):
        asked.append((start, stop))
        return ratios[start:stop]

    weights = capped_weights_until_zero(ratio_block, len(ratios))
    assert asked == [(0, 2), (2, 6)]
    np.testing.assert_array_equal(weights, [1.0, 1.0, 0.5, 0.5, 0.0])
    np.testing.assert_array_equal(capped_weights(ratios, np.ones_like(ratios)), [1.0, 1.0, 0.5, 0.5, 0, 0, 0, 0, 0, 0])
    asked.clear()
    assert len(capped_weights_until_zero(ratio_block, 3)) == 4 and asked == [(0, 2), (2, 3)]


def _sampled(verifier_case: str, seed: int) -> DraftTree:
    target, draft = toy_pair(6, seed=seed, zero_frac=0.3)
    sampler = {
        "bv": paths_sampler(1, 4),
        "spectr": paths_sampler(3, 3),
        "nss": tree_sampler([3, 2, 1], DraftScheme.IID_TREE),
        "qfree": tree_sampler([3, 2, 1], DraftScheme.DETERMINISTIC),
    }[verifier_case]
    skeleton = sampler(SeededRng(seed), draft)
    return skeleton.with_target([target(prefix) for prefix in skeleton.prefixes])


@pytest.mark.parametrize("name,verifier", [("bv", BlockVerification()), ("spectr", SpecTr()),
                                           ("nss", NaiveSpecInfer()), ("qfree", QFreeTreeVerification())])
def test_rules_read_entries_supports_and_gathers_never_full_rows(name, verifier):
    kinds = set()
    for seed in range(40):
        tree = _recorded(_sampled(name, seed))
        dense = _sampled(name, seed)
        for draw in range(3):
            got = verifier.verify(tree, SeededRng(draw))
            want = verifier.verify(dense, SeededRng(draw))
            assert (got.accepted_node, got.next_token) == (want.accepted_node, want.next_token)
        kinds |= tree.target.kinds() | tree.draft.kinds()
        assert not ({"row", "dense"} & (tree.target.kinds() | tree.draft.kinds())), (seed, tree.target.reads)
    assert "support" in kinds  # the residual / miss / bonus draws were exercised


@pytest.mark.parametrize("params", [SamplingParams(1.0), SamplingParams(0.0), SamplingParams(0.6, top_p=0.9),
                                    SamplingParams(0.8, top_k=5)], ids=repr)
def test_qfree_on_logit_rows_matches_the_dense_rows_on_the_same_random_numbers(params):
    for seed in range(15):
        generator = torch.Generator().manual_seed(seed)
        vocab = 12 + seed
        tree = _sampled("qfree", seed)  # the deterministic tree shape; its rows are replaced
        logits = torch.round(torch.randn(tree.num_nodes, vocab, generator=generator) * 2.0)  # ties
        logits[:, : vocab // 4] += 3.0  # the tree's small token ids get most of the mass
        lazy = DraftTree.build(tree.tokens, tree.parents, LogitRows(logits, params), np.zeros((tree.num_nodes, vocab)),
                               tree.scheme, validate=False)
        dense = DraftTree.build(tree.tokens, tree.parents,
                                DenseRows(LogitRows(logits, params).dense(), greedy=params.greedy),
                                np.zeros((tree.num_nodes, vocab)), tree.scheme, validate=False)
        for draw in range(4):
            got = QFreeTreeVerification().verify(lazy, SeededRng(10 * seed + draw))
            want = QFreeTreeVerification().verify(dense, SeededRng(10 * seed + draw))
            assert (got.accepted_node, got.next_token, got.is_bonus) == (want.accepted_node, want.next_token, want.is_bonus)


