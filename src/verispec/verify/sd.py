"""Token-wise speculative sampling, SD (ALGORITHMS.md §2; Leviathan et al. 2023, Chen et al. 2023).

For i = 1..L accept x_i with probability min(1, p_i(x_i)/q_i(x_i)); at the first rejection emit
y ~ norm([p_i - q_i]_+); if all L are accepted emit a bonus y ~ p_{L+1}. Lossless per iteration.

Rows are read through the tree's row providers (core.rows): the ratios need one entry per row,
fetched in blocks of 2, 4, 8, ... positions (one batched gather each, so a rejection at position i
has touched at most 2i rows), and the residual and bonus draws read only the target's support
(core.rows.draw_on_support: a top-p nucleus is a few hundred of V tokens).
"""

from __future__ import annotations

from verispec.core.probs import residual
from verispec.core.rng import Rng
from verispec.core.rows import draw_on_support
from verispec.core.tree import ROOT, DraftScheme, DraftTree
from verispec.verify.base import Verifier, VerifyResult, chain_nodes, result_at

FIRST_BLOCK = 2


def acceptance_ratio(target_prob: float, draft_prob: float) -> float:
    """min(1, p(x)/q(x)); q(x) > 0 because x was drawn from q."""
    return min(1.0, target_prob / draft_prob)


class SpeculativeSampling(Verifier):
    name = "sd"
    section = "§2"
    lossless = True
    supported_schemes = frozenset({DraftScheme.CHAIN})

    def _verify(self, tree: DraftTree, rng: Rng) -> VerifyResult:
        path = chain_nodes(tree)
        parents = [ROOT, *path[:-1]]
        start, block = 0, FIRST_BLOCK
        while start < len(path):
            stop = min(start + block, len(path))
            tokens = [int(tree.tokens[node]) for node in path[start:stop]]
            target_token = tree.target.probs_of(parents[start:stop], tokens)
            draft_token = tree.draft.probs_of(parents[start:stop], tokens)
            for offset in range(stop - start):
                if not rng.bernoulli(acceptance_ratio(target_token[offset], draft_token[offset])):
                    parent = parents[start + offset]
                    # the residual vanishes outside supp(p): built on the target's support only
                    token, guard = draw_on_support(
                        rng, tree.target, parent, lambda ids, p: residual(p, tree.draft.gather(parent, ids))
                    )
                    return result_at(tree, parent, token, False, diagnostics={"residual_guard_hits": guard})
            start, block = stop, block * 2
        leaf = path[-1] if path else ROOT
        return result_at(tree, leaf, draw_on_support(rng, tree.target, leaf)[0], True)
