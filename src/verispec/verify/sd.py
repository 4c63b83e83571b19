"""Token-wise speculative sampling, SD (ALGORITHMS.md §2; Leviathan et al. 2023, Chen et al. 2023).

For i = 1..L accept x_i with probability min(1, p_i(x_i)/q_i(x_i)); at the first rejection emit
y ~ norm([p_i - q_i]_+); if all L are accepted emit a bonus y ~ p_{L+1}. Lossless per iteration.
"""

from __future__ import annotations

from verispec.core.probs import residual
from verispec.core.rng import Rng
from verispec.core.tree import ROOT, DraftScheme, DraftTree
from verispec.verify.base import Verifier, VerifyResult, chain_nodes, result_at


def acceptance_ratio(target_prob: float, draft_prob: float) -> float:
    """min(1, p(x)/q(x)); q(x) > 0 because x was drawn from q."""
    return min(1.0, target_prob / draft_prob)


class SpeculativeSampling(Verifier):
    name = "sd"
    section = "§2"
    lossless = True
    supported_schemes = frozenset({DraftScheme.CHAIN})

    def _verify(self, tree: DraftTree, rng: Rng) -> VerifyResult:
        parent = ROOT
        for node in chain_nodes(tree):
            token = int(tree.tokens[node])
            p, q = tree.target_probs[parent], tree.draft_probs[parent]
            if not rng.bernoulli(acceptance_ratio(p[token], q[token])):
                dist, guard = residual(p, q)
                return result_at(tree, parent, rng.categorical(dist), False, diagnostics={"residual_guard_hits": guard})
            parent = node
        return result_at(tree, parent, rng.categorical(tree.target_probs[parent]), True)
