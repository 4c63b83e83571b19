"""DraftTree construction and validation (DESIGN.md §3, ALGORITHMS.md §1 "Input: a draft tree")."""

import numpy as np
import pytest

from verispec.core.tree import DraftScheme, DraftTree
from verispec.errors import InvalidDistributionError, InvalidDraftError, VerispecError

V = 4
UNIFORM = np.full(V, 1 / V)
DRAFT = np.array([0.4, 0.3, 0.2, 0.1])

#        root(0)
#        /     \
#   (1) tok 2  (2) tok 0
#      |
#   (3) tok 1
TOKENS = [-1, 2, 0, 1]
PARENTS = [-1, 0, 0, 1]


def _arrays():
    target = np.tile(UNIFORM, (4, 1))
    draft = np.zeros((4, V))
    draft[0] = DRAFT
    draft[1] = DRAFT[::-1]
    return target, draft


def _build(tokens=TOKENS, parents=PARENTS, target=None, draft=None, scheme=DraftScheme.IID_TREE, **kwargs):
    default_target, default_draft = _arrays()
    return DraftTree.build(
        tokens,
        parents,
        default_target if target is None else target,
        default_draft if draft is None else draft,
        scheme,
        **kwargs,
    )


# ----- positive cases ---------------------------------------------------------------------------


def test_structure_of_a_valid_tree():
    tree = _build()
    assert tree.num_nodes == 4
    assert tree.vocab_size == V
    assert tree.children == ((1, 2), (3,), (), ())
    assert tree.depths.tolist() == [0, 1, 1, 2]
    assert tree.max_depth == 2
    assert tree.path_to(0) == ()
    assert tree.path_to(3) == (1, 3)
    assert tree.path_to(2) == (2,)
    assert tree.tokens_to(3) == (2, 1)
    assert tree.tokens_to(2) == (0,)
    assert tree.child_with_token(0, 0) == 2
    assert tree.child_with_token(0, 2) == 1
    assert tree.child_with_token(0, 3) is None
    assert tree.target_probs.dtype == np.float64 and tree.draft_probs.dtype == np.float64


def test_children_follow_node_order_when_siblings_are_interleaved():
    # root's children are nodes 1 and 3, node 1's child is node 2: siblings keep index order
    target = np.tile(UNIFORM, (4, 1))
    draft = np.zeros((4, V))
    draft[0] = draft[1] = UNIFORM
    tree = _build(tokens=[-1, 3, 1, 0], parents=[-1, 0, 1, 0], target=target, draft=draft)
    assert tree.children == ((1, 3), (2,), (), ())
    assert tree.path_to(2) == (1, 2)
    assert tree.tokens_to(2) == (3, 1)
    assert tree.depths.tolist() == [0, 1, 2, 1]


def test_duplicate_siblings_are_kept_as_separate_nodes():
    target = np.tile(UNIFORM, (3, 1))
    draft = np.zeros((3, V))
    draft[0] = DRAFT
    tree = _build(tokens=[-1, 1, 1], parents=[-1, 0, 0], target=target, draft=draft)
    assert tree.children[0] == (1, 2)
    assert tree.child_with_token(0, 1) == 1  # the first in sampling order


def _trie_arrays(num_nodes=5):
    target = np.tile(UNIFORM, (num_nodes, 1))
    draft = np.zeros((num_nodes, V))
    draft[:3] = DRAFT
    return target, draft


# the trie of three i.i.d. paths of length 2: (2, 1), (0, 3), (2, 1)
TRIE_TOKENS, TRIE_PARENTS, TRIE_PATHS = [-1, 2, 0, 1, 3], [-1, 0, 0, 1, 2], [(1, 3), (2, 4), (1, 3)]


def test_raw_paths_are_kept_with_duplicates():
    target, draft = _trie_arrays()
    tree = _build(TRIE_TOKENS, TRIE_PARENTS, target, draft, scheme=DraftScheme.IID_PATHS, paths=TRIE_PATHS)
    assert tree.paths == ((1, 3), (2, 4), (1, 3))
    assert tree.num_paths == 3


def test_chain_builds_a_single_path():
    tokens = [1, 3, 0]
    target = np.tile(UNIFORM, (4, 1))
    draft = np.tile(UNIFORM, (3, 1))
    tree = DraftTree.chain(tokens, target, draft)
    assert tree.scheme is DraftScheme.CHAIN
    assert tree.tokens.tolist() == [-1, 1, 3, 0]
    assert tree.parents.tolist() == [-1, 0, 1, 2]
    assert tree.paths == ((1, 2, 3),)
    assert tree.children == ((1,), (2,), (3,), ())
    assert tree.tokens_to(3) == (1, 3, 0)
    assert tree.max_depth == 3
    assert not tree.draft_probs[3].any()  # the leaf has no draft vector


def test_deterministic_trees_may_carry_zero_draft_probability_tokens():
    draft = _arrays()[1]
    draft[0] = [1.0, 0.0, 0.0, 0.0]  # token 2 under the root has q = 0
    tree = _build(draft=draft, scheme=DraftScheme.DETERMINISTIC)
    assert tree.scheme is DraftScheme.DETERMINISTIC


def test_validate_false_skips_the_checks():
    target = _arrays()[0]
    target[2] = [0.5, 0.5, 0.5, 0.5]
    tree = _build(target=target, validate=False)
    with pytest.raises(InvalidDistributionError):
        tree.validate()


def test_scheme_given_as_a_string():
    assert _build(scheme="without_replacement").scheme is DraftScheme.WITHOUT_REPLACEMENT


# ----- probability vectors --------------------------------------------------------------------


def test_negative_target_probability():
    target = _arrays()[0]
    target[2] = [0.5, 0.6, -0.1, 0.0]
    with pytest.raises(InvalidDistributionError, match=r"target_probs has negative entries \(min -0.1\)"):
        _build(target=target)


def test_negative_draft_probability():
    draft = _arrays()[1]
    draft[1] = [0.6, 0.5, -0.1, 0.0]
    with pytest.raises(InvalidDistributionError, match="draft_probs of internal nodes has negative entries"):
        _build(draft=draft)


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_nan_or_inf_target(bad):
    target = _arrays()[0]
    target[3, 0] = bad
    with pytest.raises(InvalidDistributionError, match="target_probs contains NaN or inf"):
        _build(target=target)


def test_nan_draft_of_an_internal_node():
    draft = _arrays()[1]
    draft[0, 3] = np.nan
    with pytest.raises(InvalidDistributionError, match="draft_probs of internal nodes contains NaN or inf"):
        _build(draft=draft)


def test_nan_draft_of_a_leaf_is_ignored():
    # rows of nodes without children are never read
    draft = _arrays()[1]
    draft[3, 0] = np.nan
    assert _build(draft=draft).num_nodes == 4


def test_target_row_not_summing_to_one():
    target = _arrays()[0]
    target[1] = [0.25, 0.25, 0.25, 0.2]
    with pytest.raises(InvalidDistributionError, match=r"target_probs does not sum to 1 \(off by 0.05\)"):
        _build(target=target)


def test_draft_row_not_summing_to_one():
    draft = _arrays()[1]
    draft[0] = [0.4, 0.4, 0.4, 0.4]
    with pytest.raises(InvalidDistributionError, match=r"draft_probs of internal nodes does not sum to 1 \(off by 0.6\)"):
        _build(draft=draft)


def test_draft_vocabulary_differs_from_target_vocabulary():
    target, draft = _arrays()
    with pytest.raises(InvalidDraftError, match=r"draft_probs shape \(4, 5\) differs from target_probs shape \(4, 4\)"):
        _build(target=target, draft=np.hstack([draft, np.zeros((4, 1))]))


def test_draft_rows_differ_from_node_count():
    target, draft = _arrays()
    with pytest.raises(InvalidDraftError, match=r"draft_probs shape \(3, 4\) differs from target_probs shape \(4, 4\)"):
        _build(target=target, draft=draft[:3])


def test_target_rows_differ_from_node_count():
    target, draft = _arrays()
    with pytest.raises(InvalidDraftError, match=r"target_probs must have shape \(num_nodes=4, V\), got \(3, 4\)"):
        _build(target=target[:3], draft=draft[:3])


def test_target_must_be_a_matrix():
    with pytest.raises(InvalidDraftError, match="target_probs must have shape"):
        _build(target=UNIFORM, draft=UNIFORM)


# ----- structure -------------------------------------------------------------------------------


def test_token_outside_the_vocabulary():
    with pytest.raises(InvalidDraftError, match=r"node 3 has token 4, outside the vocabulary \[0, 4\)"):
        _build(tokens=[-1, 2, 0, 4])


def test_negative_token():
    with pytest.raises(InvalidDraftError, match=r"node 2 has token -1, outside the vocabulary \[0, 4\)"):
        _build(tokens=[-1, 2, -1, 1])


def test_parent_after_child():
    with pytest.raises(InvalidDraftError, match="node 1 has parent 3; parents must precede children"):
        _build(parents=[-1, 3, 0, 1])


def test_parent_is_the_node_itself():
    with pytest.raises(InvalidDraftError, match="node 2 has parent 2; parents must precede children"):
        _build(parents=[-1, 0, 2, 1])


def test_non_root_node_without_parent():
    with pytest.raises(InvalidDraftError, match="node 2 has parent -1; parents must precede children"):
        _build(parents=[-1, 0, -1, 1])


def test_root_must_have_parent_minus_one():
    with pytest.raises(InvalidDraftError, match="node 0 must be the root with parent -1"):
        _build(parents=[0, 0, 0, 1])


def test_tokens_and_parents_lengths_differ():
    with pytest.raises(InvalidDraftError, match="tokens and parents must both have one entry per node"):
        _build(parents=[-1, 0, 0])


def test_drafted_token_with_zero_draft_probability():
    draft = _arrays()[1]
    draft[1] = [0.5, 0.0, 0.5, 0.0]  # node 3 carries token 1 under node 1
    with pytest.raises(InvalidDraftError, match="node 3 carries token 1 whose draft probability is 0"):
        _build(draft=draft)


@pytest.mark.parametrize(
    "path",
    [(3,), (1, 2), (2, 3), (1, 3, 3), (0, 1), (1, 99)],
    ids=["starts-below-depth-1", "sibling-not-child", "wrong-parent", "too-deep", "root-inside", "out-of-range"],
)
def test_raw_path_that_is_not_a_root_path(path):
    with pytest.raises(InvalidDraftError, match=r"raw path \(.*\) is not a root-to-node path of the tree"):
        _build(scheme=DraftScheme.IID_PATHS, paths=[(1, 3), path])


def test_verifier_accept_probs_needs_one_entry_per_node():
    with pytest.raises(InvalidDraftError, match="verifier_accept_probs needs one entry per node"):
        _build(verifier_accept_probs=[0.5, 0.5])


def test_unknown_scheme():
    with pytest.raises(ValueError, match="not a valid DraftScheme"):
        _build(scheme="bogus")


# ----- chain -----------------------------------------------------------------------------------


def test_chain_with_wrong_number_of_draft_vectors():
    with pytest.raises(InvalidDraftError, match=r"a chain of 2 tokens needs 2 draft vectors, got shape \(3, 4\)"):
        DraftTree.chain([1, 2], np.tile(UNIFORM, (3, 1)), np.tile(UNIFORM, (3, 1)))


def test_chain_with_wrong_number_of_target_vectors():
    # L tokens need L + 1 target vectors (the last one gives the bonus token)
    with pytest.raises(InvalidDraftError, match=r"target_probs must have shape \(num_nodes=3, V\), got \(2, 4\)"):
        DraftTree.chain([1, 2], np.tile(UNIFORM, (2, 1)), np.tile(UNIFORM, (2, 1)))


def test_chain_with_mismatched_vocabularies():
    with pytest.raises(InvalidDraftError, match=r"draft_probs shape \(3, 5\) differs from target_probs shape \(3, 4\)"):
        DraftTree.chain([1, 2], np.tile(UNIFORM, (3, 1)), np.tile(np.full(5, 0.2), (2, 1)))


def test_chain_token_with_zero_draft_probability():
    draft = np.array([[0.5, 0.5, 0.0, 0.0], [0.5, 0.5, 0.0, 0.0]])
    with pytest.raises(InvalidDraftError, match="node 2 carries token 2 whose draft probability is 0"):
        DraftTree.chain([1, 2], np.tile(UNIFORM, (3, 1)), draft)


def test_root_only_tree_is_built_or_refused_clearly():
    try:
        tree = DraftTree.build([-1], [-1], [UNIFORM], [UNIFORM], DraftScheme.CHAIN)
    except VerispecError:
        return
    assert tree.num_nodes == 1


# ----- the structure must match the scheme (issue 10 item 6) ------------------------------------


def test_chain_label_on_a_branching_tree_is_refused():
    with pytest.raises(InvalidDraftError, match=r"CHAIN branches at node 0 .*use scheme IID_PATHS"):
        _build(scheme=DraftScheme.CHAIN)


def test_chain_paths_must_be_the_whole_chain():
    target, draft = np.tile(UNIFORM, (3, 1)), np.zeros((3, V))
    draft[:2] = DRAFT
    DraftTree.build([-1, 1, 2], [-1, 0, 1], target, draft, DraftScheme.CHAIN)  # no paths: fine
    DraftTree.build([-1, 1, 2], [-1, 0, 1], target, draft, DraftScheme.CHAIN, paths=[(1, 2)])
    with pytest.raises(InvalidDraftError, match=r"only path is the whole chain \(1, 2\)"):
        DraftTree.build([-1, 1, 2], [-1, 0, 1], target, draft, DraftScheme.CHAIN, paths=[(1,)])
    with pytest.raises(InvalidDraftError, match="only path is the whole chain"):
        DraftTree.build([-1, 1, 2], [-1, 0, 1], target, draft, DraftScheme.CHAIN, paths=[(1, 2), (1, 2)])


def test_iid_paths_without_raw_paths_is_refused():
    target, draft = _trie_arrays()
    with pytest.raises(InvalidDraftError, match=r"IID_PATHS has no raw paths.*pass paths="):
        _build(TRIE_TOKENS, TRIE_PARENTS, target, draft, scheme=DraftScheme.IID_PATHS)


@pytest.mark.parametrize(
    "paths,message",
    [
        ([(1, 3), (2,)], "lengths \\[1, 2\\]"),  # unequal lengths
        ([(1, 3), (1, 3)], "nodes on no path: \\[2, 4\\]"),  # node 2's branch is on no path
        ([(1, 3), (2, 4), (1,)], "lengths"),
    ],
)
def test_iid_paths_must_cover_the_trie_exactly(paths, message):
    target, draft = _trie_arrays()
    with pytest.raises(InvalidDraftError, match=message):
        _build(TRIE_TOKENS, TRIE_PARENTS, target, draft, scheme=DraftScheme.IID_PATHS, paths=paths)


def test_iid_paths_trie_children_are_distinct_tokens():
    target, draft = _trie_arrays()
    with pytest.raises(InvalidDraftError, match=r"node 0 with repeated child tokens \[2, 2\].*IID_TREE"):
        _build([-1, 2, 2, 1, 3], TRIE_PARENTS, target, draft, scheme=DraftScheme.IID_PATHS, paths=[(1, 3), (2, 4)])


def test_without_replacement_siblings_are_distinct_and_iid_tree_keeps_duplicates():
    target, draft = np.tile(UNIFORM, (3, 1)), np.zeros((3, V))
    draft[0] = DRAFT
    DraftTree.build([-1, 1, 1], [-1, 0, 0], target, draft, DraftScheme.IID_TREE)
    with pytest.raises(InvalidDraftError, match="WITHOUT_REPLACEMENT has node 0 with repeated child tokens"):
        DraftTree.build([-1, 1, 1], [-1, 0, 0], target, draft, DraftScheme.WITHOUT_REPLACEMENT)


def test_spechub_pairs_have_at_most_two_children_one_of_them_the_hub():
    target, draft = np.tile(UNIFORM, (4, 1)), np.zeros((4, V))
    draft[0] = DRAFT  # hub = token 0
    DraftTree.build([-1, 2, 0], [-1, 0, 0], target[:3], draft[:3], DraftScheme.SPECHUB_PAIR)
    with pytest.raises(InvalidDraftError, match="3 children; SpecHub nodes have 1 or 2"):
        DraftTree.build([-1, 2, 0, 1], [-1, 0, 0, 0], target, draft, DraftScheme.SPECHUB_PAIR)
    with pytest.raises(InvalidDraftError, match=r"pair \[2, 1\].*hub argmax q = 0"):
        DraftTree.build([-1, 2, 1], [-1, 0, 0], target[:3], draft[:3], DraftScheme.SPECHUB_PAIR)


@pytest.mark.parametrize("name", ["gmpbv", "spectr-gbv-star"])
def test_greedy_rules_refuse_iid_paths_without_raw_paths_even_unvalidated(name):
    """The engine builds trees with validate=False: the rules themselves must not fall back to
    K = 1 (lossy, max |Δ| 0.08) when the raw paths are missing."""
    from verispec.core.rng import SeededRng
    from verispec.verify.registry import get_method

    target, draft = _trie_arrays()
    tree = _build(TRIE_TOKENS, TRIE_PARENTS, target, draft, scheme=DraftScheme.IID_PATHS, validate=False)
    with pytest.raises(InvalidDraftError, match="without its raw paths.*paths="):
        get_method(name).verifier.verify(tree, SeededRng(0))
