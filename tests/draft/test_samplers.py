"""Draft samplers (ALGORITHMS.md §1, §8.1, §9.1, §13): structure of the drafted trees and, by exact
enumeration through the replay Rng (§14.1), the law of what they draw."""

import itertools

import numpy as np
import pytest

from verispec.core.rng import SeededRng, enumerate_outcomes
from verispec.core.tree import DraftScheme
from verispec.draft.samplers import sample_chain, sample_iid_paths, sample_tree, shape_from_branching
from verispec.errors import ConfigError
from verispec.models.toy import ToyDraft, ToyModel, context_free_pair
from verispec.verify.spechub import spechub_hub, spechub_joint

TREE_SCHEMES = [DraftScheme.IID_TREE, DraftScheme.WITHOUT_REPLACEMENT, DraftScheme.SPECHUB_PAIR, DraftScheme.DETERMINISTIC]


def _toy(vocab: int = 5, seed: int = 0):
    target = ToyModel(vocab, seed=seed)
    return target, ToyDraft(target, seed=seed + 100)


def _fixed_draft(probs):
    """A context-free draft q(.|prefix) = probs."""
    return context_free_pair(probs, probs)[1]


def _tree(skeleton, target):
    """The validated DraftTree of a skeleton, with the toy target's vectors."""
    return skeleton.with_target(np.stack([target(prefix) for prefix in skeleton.prefixes]))


def _raw_token_paths(skeleton):
    return tuple(tuple(skeleton.tokens[node] for node in path) for path in skeleton.paths)


# ----- configuration errors --------------------------------------------------------------------


@pytest.mark.parametrize("num_drafts,draft_len,name", [(0, 3, "num_drafts"), (-1, 3, "num_drafts"), (2, 0, "draft_len"), (1.5, 2, "num_drafts")])
def test_sample_iid_paths_rejects_k_or_l_below_one(num_drafts, draft_len, name):
    _, draft = _toy()
    with pytest.raises(ConfigError, match=rf"{name} \(.\) must be an integer >= 1"):
        sample_iid_paths(SeededRng(0), draft, num_drafts, draft_len)


def test_sample_chain_rejects_zero_length():
    with pytest.raises(ConfigError, match=r"draft_len \(L\) must be an integer >= 1, got 0"):
        sample_chain(SeededRng(0), _toy()[1], 0)


def test_sample_tree_rejects_empty_shapes_and_bad_widths():
    _, draft = _toy()
    with pytest.raises(ConfigError, match="at least one child under the root"):
        sample_tree(SeededRng(0), draft, (), DraftScheme.IID_TREE)
    with pytest.raises(ConfigError, match="children per depth must be an integer >= 1, got 0"):
        sample_tree(SeededRng(0), draft, [2, 0], DraftScheme.IID_TREE)


def test_sample_tree_refuses_path_schemes():
    with pytest.raises(ConfigError, match="does not draw scheme 'iid_paths'; use sample_iid_paths"):
        sample_tree(SeededRng(0), _toy()[1], [2], DraftScheme.IID_PATHS)


def test_spechub_tree_refuses_three_children():
    with pytest.raises(ConfigError, match="SpecHub trees have 1 or 2 children per node, got 3"):
        sample_tree(SeededRng(0), _toy()[1], [3], DraftScheme.SPECHUB_PAIR)


# ----- K i.i.d. paths: trie + raw paths --------------------------------------------------------


@pytest.mark.parametrize("seed", range(5))
def test_iid_paths_trie_structure(seed):
    target, draft = _toy(vocab=3, seed=seed)
    num_drafts, draft_len = 6, 3
    skeleton = sample_iid_paths(SeededRng(seed), draft, num_drafts, draft_len)
    tree = _tree(skeleton, target)  # validates: parents, raw paths, q(token) > 0
    assert tree.scheme is DraftScheme.IID_PATHS
    assert tree.num_paths == num_drafts
    assert all(len(path) == draft_len for path in tree.paths)
    assert all(tree.depths[path[-1]] == draft_len for path in tree.paths)
    # every node lies on some raw path, so the trie has no node beyond the drafted ones
    assert set(range(1, tree.num_nodes)) == {node for path in tree.paths for node in path}
    for node in range(tree.num_nodes):
        kids = tree.children[node]
        child_tokens = [int(tree.tokens[c]) for c in kids]
        assert len(set(child_tokens)) == len(child_tokens)  # distinct children
        # children in order of first appearance, scanning the raw paths in draft order
        depth = int(tree.depths[node])
        through_node = [path for path in tree.paths if node == 0 or path[depth - 1] == node]
        first_seen = []
        for path in through_node:
            if len(path) > depth and path[depth] not in first_seen:
                first_seen.append(path[depth])
        assert list(kids) == first_seen
        # the stored draft vector is q(.|prefix) for internal nodes and zero for leaves
        if kids:
            np.testing.assert_array_equal(tree.draft_probs[node], draft(skeleton.prefixes[node]))
        else:
            assert not tree.draft_probs[node].any()
    for node in range(1, tree.num_nodes):
        assert skeleton.prefixes[node] == tree.tokens_to(node)


def test_raw_paths_keep_duplicates():
    # a point-mass draft: all K paths are identical, the trie is a single chain
    draft = _fixed_draft([0.0, 1.0, 0.0])
    skeleton = sample_iid_paths(SeededRng(0), draft, 4, 3)
    assert skeleton.scheme is DraftScheme.IID_PATHS
    assert skeleton.tokens == (-1, 1, 1, 1)
    assert skeleton.parents == (-1, 0, 1, 2)
    assert skeleton.paths == ((1, 2, 3),) * 4


def test_one_path_is_a_chain():
    target, draft = _toy()
    skeleton = sample_iid_paths(SeededRng(3), draft, 1, 4)
    assert skeleton.scheme is DraftScheme.CHAIN
    assert skeleton.parents == (-1, 0, 1, 2, 3)
    assert skeleton.paths == ((1, 2, 3, 4),)
    chain = sample_chain(SeededRng(3), draft, 4)
    assert (chain.tokens, chain.parents, chain.paths, chain.scheme) == (
        skeleton.tokens, skeleton.parents, skeleton.paths, skeleton.scheme
    )
    np.testing.assert_array_equal(chain.draft_probs, skeleton.draft_probs)
    _tree(skeleton, target)


@pytest.mark.parametrize("num_drafts", [2, 4])
def test_unmerged_paths_form_a_broom(num_drafts):
    target, draft = _toy(vocab=2)  # V = 2 makes repeated tokens certain
    draft_len = 3
    skeleton = sample_iid_paths(SeededRng(1), draft, num_drafts, draft_len, merge=False)
    tree = _tree(skeleton, target)
    assert tree.scheme is DraftScheme.IID_TREE
    assert tree.num_nodes == num_drafts * draft_len + 1
    assert len(tree.children[0]) == num_drafts
    assert tree.num_paths == num_drafts
    assert len({node for path in tree.paths for node in path}) == num_drafts * draft_len  # disjoint
    for path in tree.paths:
        for node in path[:-1]:
            assert len(tree.children[node]) == 1  # each bristle is an unmerged chain
        assert tree.children[0][tree.paths.index(path)] == path[0]


def test_unmerged_single_path_is_a_chain():
    skeleton = sample_iid_paths(SeededRng(1), _toy()[1], 1, 3, merge=False)
    assert skeleton.scheme is DraftScheme.CHAIN


def _product_law(draft, num_drafts, draft_len, vocab):
    path_prob = {}
    for path in itertools.product(range(vocab), repeat=draft_len):
        prob = 1.0
        for depth, token in enumerate(path):
            prob *= draft(path[:depth])[token]
        path_prob[path] = prob
    law = {}
    for paths in itertools.product(path_prob, repeat=num_drafts):
        prob = float(np.prod([path_prob[p] for p in paths]))
        if prob > 0:
            law[paths] = prob
    return law


@pytest.mark.parametrize("merge", [True, False])
def test_iid_raw_paths_have_the_product_law(merge):
    _, draft = _toy(vocab=3, seed=4)
    law = enumerate_outcomes(lambda rng: _raw_token_paths(sample_iid_paths(rng, draft, 2, 2, merge=merge)))
    expected = _product_law(draft, 2, 2, 3)
    assert set(law) == set(expected)
    assert max(abs(law[key] - expected[key]) for key in expected) < 1e-15
    assert sum(law.values()) == pytest.approx(1.0, abs=1e-12)


def test_iid_raw_paths_product_law_with_exact_zeros():
    target = ToyModel(3, seed=9, zero_frac=0.4)
    draft = ToyDraft(target, seed=19, zero_frac=0.4)
    law = enumerate_outcomes(lambda rng: _raw_token_paths(sample_iid_paths(rng, draft, 2, 2)))
    expected = _product_law(draft, 2, 2, 3)
    assert set(law) == set(expected)
    assert max(abs(law[key] - expected[key]) for key in expected) < 1e-15


# ----- token trees -----------------------------------------------------------------------------


def test_shape_from_branching():
    assert shape_from_branching([2, 1]) == (((),), ((),))
    assert shape_from_branching([3]) == ((), (), ())


@pytest.mark.parametrize("scheme", TREE_SCHEMES, ids=lambda s: s.value)
def test_sample_tree_branching_2_2(scheme):
    target, draft = _toy(vocab=6, seed=2)
    skeleton = sample_tree(SeededRng(0), draft, [2, 2], scheme)
    tree = _tree(skeleton, target)
    assert tree.scheme is scheme
    assert tree.num_nodes == 7
    assert tree.depths.tolist() == [0, 1, 1, 2, 2, 2, 2]
    assert tree.paths == ()
    for node in (0, 1, 2):
        assert len(tree.children[node]) == 2
        np.testing.assert_array_equal(tree.draft_probs[node], draft(skeleton.prefixes[node]))
        tokens = [int(tree.tokens[c]) for c in tree.children[node]]
        q = draft(skeleton.prefixes[node])
        if scheme is not DraftScheme.IID_TREE:
            assert tokens[0] != tokens[1]
        if scheme is DraftScheme.SPECHUB_PAIR:
            hub = spechub_hub(q)
            assert hub in tokens and (tokens[0] == hub or tokens[1] == hub)
        if scheme is DraftScheme.DETERMINISTIC:
            assert tokens == list(np.argsort(-q, kind="stable")[:2])


def test_nested_shape():
    target, draft = _toy()
    shape = (((), ()), ((),))  # root: two children; the first has two, the second one
    skeleton = sample_tree(SeededRng(0), draft, shape, DraftScheme.WITHOUT_REPLACEMENT)
    tree = _tree(skeleton, target)
    assert [len(kids) for kids in tree.children] == [2, 2, 1, 0, 0, 0]


def test_without_replacement_children_are_distinct():
    target, draft = _toy(vocab=4, seed=5)
    for seed in range(20):
        tree = _tree(sample_tree(SeededRng(seed), draft, [4, 3], DraftScheme.WITHOUT_REPLACEMENT), target)
        for kids in tree.children:
            tokens = [int(tree.tokens[c]) for c in kids]
            assert len(set(tokens)) == len(tokens)
        assert len(tree.children[0]) == 4  # the whole support, each token once


def test_without_replacement_stops_when_the_support_is_exhausted():
    point_mass = _fixed_draft([0.0, 0.0, 1.0, 0.0])
    skeleton = sample_tree(SeededRng(0), point_mass, [3, 2], DraftScheme.WITHOUT_REPLACEMENT)
    assert skeleton.tokens == (-1, 2, 2)
    assert skeleton.parents == (-1, 0, 1)
    two_tokens = _fixed_draft([0.0, 0.3, 0.0, 0.7])
    law = enumerate_outcomes(lambda rng: sample_tree(rng, two_tokens, [4], DraftScheme.WITHOUT_REPLACEMENT).tokens)
    assert law == pytest.approx({(-1, 1, 3): 0.3, (-1, 3, 1): 0.7}, abs=1e-15)


def test_without_replacement_pair_law():
    q = np.array([0.1, 0.2, 0.3, 0.4])
    law = enumerate_outcomes(lambda rng: sample_tree(rng, _fixed_draft(q), [2], DraftScheme.WITHOUT_REPLACEMENT).tokens[1:])
    expected = {(x, y): q[x] * q[y] / (1 - q[x]) for x in range(4) for y in range(4) if x != y}
    assert law == pytest.approx(expected, abs=1e-15)


def test_iid_tree_children_law_is_the_product_law():
    q = np.array([0.5, 0.0, 0.2, 0.3])
    law = enumerate_outcomes(lambda rng: sample_tree(rng, _fixed_draft(q), [2], DraftScheme.IID_TREE).tokens[1:])
    expected = {(x, y): q[x] * q[y] for x in range(4) for y in range(4) if q[x] * q[y] > 0}
    assert law == pytest.approx(expected, abs=1e-15)


def test_deterministic_children_skip_zero_probability_tokens():
    skeleton = sample_tree(SeededRng(0), _fixed_draft([0.0, 0.6, 0.0, 0.4]), [3], DraftScheme.DETERMINISTIC)
    assert skeleton.tokens == (-1, 1, 3)


# ----- SpecHub pairs (§9.1) ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "q",
    [
        [0.1, 0.5, 0.15, 0.25],  # hub 1
        [0.3, 0.3, 0.2, 0.2],  # tie for the hub: lowest id (0)
        [0.0, 0.2, 0.0, 0.8],  # zeros, hub last
        [0.6, 0.4],  # V = 2
    ],
)
def test_spechub_pair_law_equals_the_hub_joint(q):
    q = np.array(q)
    hub = int(np.flatnonzero(q == q.max())[0])
    law = enumerate_outcomes(lambda rng: sample_tree(rng, _fixed_draft(q), [2], DraftScheme.SPECHUB_PAIR).tokens[1:])
    for first, second in law:
        if first != hub:
            assert second == hub  # x2 = hub when x1 != hub
        else:
            assert second != hub  # no (hub, hub) pair
    expected = {}
    for x in range(len(q)):
        if x != hub and q[x] > 0:
            expected[(x, hub)] = q[x]  # Q(x, a) = q(x)
            expected[(hub, x)] = q[hub] * q[x] / (1 - q[hub])  # Q(a, x) = q(a) q(x) / (1 - q(a))
    assert law == pytest.approx(expected, abs=1e-15)
    joint = spechub_joint(q)
    assert {pair: float(joint[pair]) for pair in law} == pytest.approx(law, abs=1e-15)
    assert joint.sum() == pytest.approx(1.0, abs=1e-15)


def test_spechub_point_mass_gives_a_single_child():
    skeleton = sample_tree(SeededRng(0), _fixed_draft([0.0, 1.0, 0.0]), [2, 2], DraftScheme.SPECHUB_PAIR)
    assert skeleton.tokens == (-1, 1, 1)


def test_spechub_tree_with_unary_levels():
    target, draft = _toy(vocab=5, seed=6)
    tree = _tree(sample_tree(SeededRng(2), draft, [2, 1, 1], DraftScheme.SPECHUB_PAIR), target)
    assert [len(kids) for kids in tree.children] == [2, 1, 1, 1, 1, 0, 0]


def test_spechub_first_draft_is_marginally_q():
    q = np.array([0.1, 0.5, 0.15, 0.25])
    law = enumerate_outcomes(lambda rng: sample_tree(rng, _fixed_draft(q), [2], DraftScheme.SPECHUB_PAIR).tokens[1])
    assert law == pytest.approx({x: q[x] for x in range(4)}, abs=1e-15)


# ----- batched draft scoring ---------------------------------------------------------------------


class _CountingDraft:
    """A draft that scores whole levels: counts single-prefix and batched calls."""

    def __init__(self, draft):
        self.draft = draft
        self.single_calls = 0
        self.batch_calls = []

    def __call__(self, prefix):
        self.single_calls += 1
        return self.draft(prefix)

    def batch_probs(self, prefixes):
        self.batch_calls.append(len(prefixes))
        return np.stack([self.draft(prefix) for prefix in prefixes])


@pytest.mark.parametrize("merge", [True, False])
def test_batch_probs_called_once_per_level_for_paths(merge):
    _, draft = _toy(vocab=4, seed=7)
    counting = _CountingDraft(draft)
    skeleton = sample_iid_paths(SeededRng(5), counting, 3, 4, merge=merge)
    assert counting.single_calls == 0
    assert len(counting.batch_calls) == 4
    assert counting.batch_calls[0] == 1  # the root once, although three paths start there
    # the same draws as with a per-prefix draft
    assert skeleton.tokens == sample_iid_paths(SeededRng(5), draft, 3, 4, merge=merge).tokens


@pytest.mark.parametrize("scheme", TREE_SCHEMES, ids=lambda s: s.value)
def test_batch_probs_called_once_per_level_for_trees(scheme):
    _, draft = _toy(vocab=6, seed=8)
    counting = _CountingDraft(draft)
    skeleton = sample_tree(SeededRng(5), counting, [2, 2, 1], scheme)
    assert counting.single_calls == 0
    assert len(counting.batch_calls) == 3
    assert counting.batch_calls[0] == 1
    assert skeleton.tokens == sample_tree(SeededRng(5), draft, [2, 2, 1], scheme).tokens
