"""SPRINTER's decision rule (ALGORITHMS.md §11; [SPRINTER paper], arXiv 2502.04557). LOSSY.

Draft token by token; a learned verifier accepts x_i without any target call with probability
``tree.verifier_accept_probs[node]`` (0/1 for a thresholded score s >= eta). At the first
verifier rejection the target is called once and the token gets the standard test: accept with
min(1, p(x)/q(x)), else emit y ~ norm([p - q]_+); the round ends there. If all L drafted tokens
are verifier-accepted the round ends with one target call and a bonus token from p_{L+1}
(L caps a round's length).

With an idealised verifier of false-positive rate beta the token law is (1 - beta) p + beta q
(Thm 3.1); beta = 0 is lossless.
"""

from __future__ import annotations

import numpy as np

from verispec.core.probs import residual
from verispec.core.rng import Rng
from verispec.core.tree import ROOT, DraftScheme, DraftTree
from verispec.errors import ConfigError, InvalidDraftError
from verispec.verify.base import Verifier, VerifyResult, chain_nodes, result_at
from verispec.verify.sd import acceptance_ratio


def sprinter_target_check(rng: Rng, target: np.ndarray, draft: np.ndarray, token: int) -> tuple[int, bool, bool]:
    """The target's test of a verifier-rejected token: returns (emitted token, kept the drafted
    token?, residual guard hit). target/draft: (V,)."""
    if rng.bernoulli(acceptance_ratio(target[token], draft[token])):
        return token, True, False
    dist, guard = residual(target, draft)
    return rng.categorical(dist), False, guard


def check_threshold(eta: float) -> float:
    if not 0.0 < eta < 1.0:
        raise ConfigError(f"SPRINTER's threshold eta must lie in (0, 1), got {eta}")
    return float(eta)


def acceptable_tokens(target: np.ndarray, draft: np.ndarray, gamma: float = 1.0) -> np.ndarray:
    """Label of §11: token x is 'acceptable' iff q(x)/p(x) <= gamma (p(x) = 0: not acceptable)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return (target > 0) & (draft <= gamma * target)


def idealized_accept_probs(tree: DraftTree, tpr: float, fpr: float, gamma: float = 1.0) -> np.ndarray:
    """Per-node acceptance of an idealised verifier (§11 guarantees): TPR on acceptable tokens,
    FPR on the others. Shape (num_nodes,); the root gets 0."""
    probs = np.zeros(tree.num_nodes)
    for node in range(1, tree.num_nodes):
        parent = int(tree.parents[node])
        ok = acceptable_tokens(tree.target_probs[parent], tree.draft_probs[parent], gamma)[tree.tokens[node]]
        probs[node] = tpr if ok else fpr
    return probs


class Sprinter(Verifier):
    name = "sprinter"
    section = "§11"
    lossless = False
    supported_schemes = frozenset({DraftScheme.CHAIN})

    def _verify(self, tree: DraftTree, rng: Rng) -> VerifyResult:
        if tree.verifier_accept_probs is None:
            raise InvalidDraftError(
                "sprinter needs the learned verifier's per-token acceptance (tree.verifier_accept_probs); "
                "train one with `verispec sprinter train` or pass an idealised verifier"
            )
        parent = ROOT
        for node in chain_nodes(tree):
            if not rng.bernoulli(tree.verifier_accept_probs[node]):
                token, kept, guard = sprinter_target_check(
                    rng, tree.target_probs[parent], tree.draft_probs[parent], int(tree.tokens[node])
                )
                return result_at(
                    tree, parent, token, False, diagnostics={"target_checked": 1, "kept_draft_token": kept, "residual_guard_hits": guard}
                )
            parent = node
        return result_at(tree, parent, rng.categorical(tree.target_probs[parent]), True, diagnostics={"target_checked": 0})


class IdealizedSprinter(Sprinter):
    """SPRINTER with an idealised verifier of known TPR/FPR (§11 guarantees, §14.5 item 8): used
    to check Thm 3.1 / 3.3 by exact enumeration and in the audit."""

    def __init__(self, tpr: float, fpr: float, gamma: float = 1.0):
        self.tpr, self.fpr, self.gamma = tpr, fpr, gamma

    def _verify(self, tree: DraftTree, rng: Rng) -> VerifyResult:
        from dataclasses import replace

        probs = idealized_accept_probs(tree, self.tpr, self.fpr, self.gamma)
        return super()._verify(replace(tree, verifier_accept_probs=probs), rng)

    def __repr__(self) -> str:
        return f"IdealizedSprinter(tpr={self.tpr}, fpr={self.fpr}, gamma={self.gamma})"
