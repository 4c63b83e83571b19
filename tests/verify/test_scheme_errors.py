"""Every verifier refuses drafts drawn with a scheme under which it is not exact (DESIGN.md §3:
"using RRS on deduplicated i.i.d. candidates silently breaks losslessness"), and the registry
names every method."""

import re

import numpy as np
import pytest

from verispec.core.rng import SeededRng
from verispec.core.tree import DraftScheme, DraftTree
from verispec.errors import ConfigError, UnsupportedDraftSchemeError
from verispec.verify.registry import METHODS, NEGATIVE_CONTROLS, get_method

ALL_SPECS = {**METHODS, **NEGATIVE_CONTROLS}

# Rules that are exact on every scheme, so there is nothing for them to refuse: NSS emits exact
# target draws whatever the tree (ALGORITHMS.md §13).
ACCEPTS_EVERY_SCHEME = {"nss", "qfree"}


def _tree(scheme: DraftScheme) -> DraftTree:
    """A small valid tree whose structure matches ``scheme`` (DraftTree.validate checks it):
    a chain 0 -> 2 for CHAIN, the trie of the paths (0, 2), (1, 3) for IID_PATHS, else
    root -> (tokens 0, 1), node 1 -> token 2."""
    target = np.tile([0.25, 0.25, 0.25, 0.25], (5, 1))
    draft = np.zeros((5, 4))
    draft[0] = [0.4, 0.3, 0.2, 0.1]
    draft[1] = draft[2] = [0.1, 0.2, 0.3, 0.4]
    if scheme is DraftScheme.CHAIN:
        tokens, parents, paths = [-1, 0, 2], [-1, 0, 1], [(1, 2)]
    elif scheme is DraftScheme.IID_PATHS:
        tokens, parents, paths = [-1, 0, 1, 2, 3], [-1, 0, 0, 1, 2], [(1, 3), (2, 4)]
    else:
        tokens, parents, paths = [-1, 0, 1, 2], [-1, 0, 0, 1], []
    n = len(tokens)
    return DraftTree.build(
        tokens, parents, target[:n], draft[:n], scheme, paths=paths, verifier_accept_probs=np.full(n, 0.5)
    )


UNSUPPORTED = [
    (name, scheme)
    for name, spec in ALL_SPECS.items()
    for scheme in DraftScheme
    if scheme not in spec.verifier.supported_schemes
]


@pytest.mark.parametrize("name,scheme", UNSUPPORTED, ids=[f"{n}-{s.value}" for n, s in UNSUPPORTED])
def test_verifier_refuses_unsupported_scheme(name, scheme):
    verifier = ALL_SPECS[name].verifier
    message = rf"verifier '{re.escape(verifier.name)}' is not exact on drafts drawn with scheme '{scheme.value}'"
    with pytest.raises(UnsupportedDraftSchemeError, match=message):
        verifier.verify(_tree(scheme), SeededRng(0))
    with pytest.raises(UnsupportedDraftSchemeError, match="needs one of: "):
        verifier.check_scheme(_tree(scheme))


@pytest.mark.parametrize("name", sorted(ALL_SPECS))
def test_every_verifier_refuses_at_least_one_scheme(name):
    supported = ALL_SPECS[name].verifier.supported_schemes
    if name in ACCEPTS_EVERY_SCHEME:
        assert supported == frozenset(DraftScheme)
    else:
        assert set(DraftScheme) - set(supported), f"{name} accepts every scheme"


@pytest.mark.parametrize("name", sorted(ALL_SPECS))
def test_no_verifier_accepts_deterministic_trees_unless_exact_on_any_tree(name):
    # deterministic (top-k) children are lossless for greedy decoding only (§13)
    if name not in ACCEPTS_EVERY_SCHEME:
        assert DraftScheme.DETERMINISTIC not in ALL_SPECS[name].verifier.supported_schemes


@pytest.mark.parametrize("name", sorted(ALL_SPECS))
def test_registry_draft_kind_is_a_supported_scheme(name):
    spec = ALL_SPECS[name]
    assert spec.name == name == spec.verifier.name
    supported = spec.verifier.supported_schemes
    assert spec.draft in ("chain", "paths", "tree")
    if spec.draft == "chain":
        assert DraftScheme.CHAIN in supported
    elif spec.draft == "paths":
        assert DraftScheme.IID_PATHS in supported
    else:
        assert spec.tree_scheme in supported
    if spec.tree_scheme is not None:
        assert spec.tree_scheme in supported


def test_negative_controls_are_labelled_lossy():
    for spec in NEGATIVE_CONTROLS.values():
        assert spec.negative_control and not spec.lossless
    assert not set(METHODS) & set(NEGATIVE_CONTROLS)


def test_rrs_refuses_deduplicated_tries_drawn_without_replacement():
    # the pitfall of §8.1: RRS's with-replacement formulas on distinct candidates
    with pytest.raises(UnsupportedDraftSchemeError, match="'rrs'.*'without_replacement'"):
        get_method("rrs").verifier.verify(_tree(DraftScheme.WITHOUT_REPLACEMENT), SeededRng(0))


def test_unknown_method_lists_the_valid_names():
    with pytest.raises(ConfigError, match="unknown method 'nope'; choose one of: ") as info:
        get_method("nope")
    for name in METHODS:
        assert name in str(info.value)


def test_negative_controls_need_allow_controls():
    with pytest.raises(ConfigError, match="unknown method 'rrs-dedup'"):
        get_method("rrs-dedup")
    assert get_method("rrs-dedup", allow_controls=True) is NEGATIVE_CONTROLS["rrs-dedup"]


@pytest.mark.parametrize("name", sorted(METHODS))
def test_get_method_returns_the_registered_spec(name):
    assert get_method(name) is METHODS[name]
