"""SpecHub: K = 2 drafts from a hub-centred joint, verified by an optimal transport plan
(ALGORITHMS.md §9; [SpecHub paper], arXiv 2411.05289). Notation p = target, q = draft.

Draft sampling (§9.1), hub a = argmax_x q(x) (lowest id on ties):
    x1 ~ q; x2 = a if x1 != a, else x2 ~ q restricted to V \\ {a}.
    Joint Q(x, a) = q(x), Q(a, x) = q(a) q(x) / (1 - q(a)) for x != a; Q(a, a) = 0.
    q(a) = 1 (degenerate): the single draft a (a unary node, verified by plain SD).

Transport masses (§9.2), x != a:
    pi1(x) = min(p(x), q(x))                 accept x from the pair (x, a)
    pi2(x) = min([p(x) - q(x)]_+, Q(a, x))   accept x from the pair (a, x)
    R1 = sum_x (Q(a, x) - pi2(x)),  R2 = sum_x (q(x) - pi1(x))
    A1 = min(p(a), R1),  A2 = min(p(a) - A1, R2)

Verification, corrected procedure (§9.3):
    pair (x1, a): accept x1 w.p. min(1, p(x1)/q(x1)); else accept a w.p. A2/R2
    pair (a, x2): accept x2 w.p. pi2(x2)/Q(a, x2);   else accept a w.p. A1/R1
    otherwise y ~ norm(r), r(x) = [[p(x) - q(x)]_+ - Q(a, x)]_+ = [p(x) - (1 + c) q(x)]_+ for
    x != a (c = q(a)/(1 - q(a))), r(a) = p(a) - A1 - A2 (= 0 in exact arithmetic).
Acceptance p(a) + sum_{x != a} min(p(x), q(x)/(1 - q(a))), the LP optimum for Q_hub (§10).

Trees (§13, scheme SPECHUB_PAIR): top-down; a binary node's children are the pair in sampling
order (x1, x2) and are verified as above; a unary node is a plain SD step; a leaf gives a bonus.
The hub of a pair is read off the pair in O(1) (the member with the larger q, the lower id on a
tie); that it is argmax q is checked on the rejection branches (one argmax of the draft row).

``SpecHubLiteral`` is the negative control of §9.4: the paper's literal pseudocode, where the
update p'(a) = p(a) - A1 happens only inside the x1 = a branch (so the (x1, a) branch accepts the
hub with probability min(p(a), R2)/R2) and the final residual keeps r(a) = p(a). NOT lossless.

The module-level reference functions take float64 vectors of shape (V,). The verifier reads two
entries per side at a binary node (core.rows) and, after a rejection, works on the target's
support at the node (``_pair_rule`` says why each sum may skip the rest of V).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from verispec.core.probs import RESIDUAL_MASS_GUARD, residual
from verispec.core.rng import Rng
from verispec.core.rows import Rows
from verispec.core.tree import DraftScheme, DraftTree
from verispec.errors import InvalidDraftError
from verispec.verify.base import Verifier, VerifyResult
from verispec.verify.rrs import top_down
from verispec.verify.support import SupportDraw, kept_on_support, positions_of


def spechub_hub(draft: np.ndarray) -> int:
    """The hub a = argmax_x q(x), lowest token id on ties (§9.1); draft shape (V,)."""
    return int(np.argmax(draft))


def sample_spechub_pair(rng: Rng, draft: np.ndarray) -> tuple[int, ...]:
    """Draw SpecHub's ordered pair (x1, x2) from Q_hub (§9.1); draft q shape (V,).

    x1 ~ q; x2 = hub if x1 != hub, else x2 ~ q restricted to V \\ {hub}. When q(hub) = 1 no
    second distinct token exists and the single draft (hub,) is returned; so also when q holds no
    mass outside the hub but q(hub) reads 1 - 1e-7 (a float32-normalised row): normalised, that
    row is the point mass at the hub, and drawing x2 from the empty rest would divide 0 by 0.
    """
    draft = np.asarray(draft, dtype=np.float64)
    hub = spechub_hub(draft)
    if draft[hub] >= 1.0 or np.count_nonzero(draft) == 1:
        return (hub,)
    first = rng.categorical(draft)
    if first != hub:
        return (int(first), hub)
    rest = draft.copy()
    rest[hub] = 0.0
    return (hub, int(rng.categorical(rest / rest.sum())))


def spechub_joint(draft: np.ndarray) -> np.ndarray:
    """Q_hub as a (V, V) matrix, entry [x1, x2] = Q(x1, x2) (§9.1); requires q(hub) < 1."""
    draft = np.asarray(draft, dtype=np.float64)
    hub = spechub_hub(draft)
    if draft[hub] >= 1.0:
        raise InvalidDraftError("SpecHub's pair law needs q(hub) < 1; with q(hub) = 1 there is a single draft")
    joint = np.zeros((draft.size, draft.size))
    others = draft.copy()
    others[hub] = 0.0
    joint[:, hub] = others
    joint[hub, :] = draft[hub] * others / (1.0 - draft[hub])
    return joint


class SpecHubTransport(NamedTuple):
    """§9.2 transport masses: pi1, pi2 shape (V,) (zero at the hub), scalars R1, R2, A1, A2."""

    pi1: np.ndarray
    pi2: np.ndarray
    R1: float
    R2: float
    A1: float
    A2: float


def spechub_transport(target: np.ndarray, draft: np.ndarray) -> SpecHubTransport:
    """pi1, pi2, R1, R2, A1, A2 of §9.2 for target p and draft q (shape (V,), q(hub) < 1)."""
    target = np.asarray(target, dtype=np.float64)
    draft = np.asarray(draft, dtype=np.float64)
    hub = spechub_hub(draft)
    hub_mass = float(draft[hub])
    if hub_mass >= 1.0:
        raise InvalidDraftError("SpecHub's transport needs q(hub) < 1; with q(hub) = 1 verify the single draft by SD")
    hub_pair = draft * (hub_mass / (1.0 - hub_mass))  # Q(a, x)
    pi1 = np.minimum(target, draft)
    pi2 = np.minimum(np.maximum(target - draft, 0.0), hub_pair)
    pi1[hub] = 0.0
    pi2[hub] = 0.0
    hub_pair[hub] = 0.0
    draft_others = draft.copy()
    draft_others[hub] = 0.0
    r1 = float(hub_pair.sum() - pi2.sum())
    r2 = float(draft_others.sum() - pi1.sum())
    a1 = min(float(target[hub]), r1)
    a2 = min(float(target[hub]) - a1, r2)
    return SpecHubTransport(pi1, pi2, r1, r2, a1, a2)


def spechub_acceptance(target: np.ndarray, draft: np.ndarray) -> float:
    """Closed-form acceptance p(a) + sum_{x != a} min(p(x), q(x)/(1 - q(a))) (§9.3);
    p(a) in the degenerate case q(a) = 1 (plain SD on the single draft a)."""
    target = np.asarray(target, dtype=np.float64)
    draft = np.asarray(draft, dtype=np.float64)
    hub = spechub_hub(draft)
    if draft[hub] >= 1.0:
        return float(target[hub])
    capped = np.minimum(target, draft / (1.0 - draft[hub]))
    return float(target[hub] + capped.sum() - capped[hub])


# ----- per-node rules -------------------------------------------------------------------------


def _sd_rule(rng: Rng, target: Rows, draft: Rows, node: int, tokens: Sequence[int]):
    """A unary node: plain SD (§2); target / draft are the tree's row providers. The residual
    norm([p - q]_+) vanishes outside supp(p): built on the target's support."""
    token = tokens[0]
    p_x, q_x = target.prob(node, token), draft.prob(node, token)
    if rng.bernoulli(1.0 if p_x >= q_x else p_x / q_x):
        return 0, None, 0
    return None, SupportDraw(lambda ids, p: residual(p, draft.gather(node, ids))), 0


def _pair_rule(rng: Rng, target_rows: Rows, draft_rows: Rows, node: int, tokens: Sequence[int], literal: bool):
    """A binary node with the pair (x1, x2) in sampling order (§9.3; §9.4 when ``literal``).
    Returns (accepted index, SupportDraw of the residual r or None, guard hits). The pair's
    entries come from one gather per side; the target's support only after the first test rejects.

    Where each quantity lives, S = supp(p(.|u)), ids, p_S = target.support(u),
    q_S = draft.gather(u, ids), c = q(a)/(1 - q(a)):
      pi1(x) = min(p, q), pi2(x) = min([p - q]_+, c q) and r(x) = [p - (1 + c) q]_+ are 0 where
      p(x) = 0, so R1 = q(a) - sum_{x != a} pi2(x) and r are sums / vectors over S;
      R2 = sum_{x != a} (q(x) - pi1(x)) = (1 - q(a)) - sum_{S - {a}} pi1: the draft's mass outside
      S enters only through sum_V q = 1 (a scalar), never by a pass over V.
    The hub check (a = argmax q) is the one read of a whole row: an argmax of the draft row (no
    arithmetic over V), on the rejection branches only."""
    first, second = int(tokens[0]), int(tokens[1])
    p_first, p_second = target_rows.probs_of([node, node], [first, second])
    q_first, q_second = draft_rows.probs_of([node, node], [first, second])
    hub = _pair_hub(float(q_first), float(q_second), first, second)
    hub_mass = float(q_first if hub == first else q_second)
    ratio_hub = hub_mass / (1.0 - hub_mass)  # Q(a, x) = ratio_hub * q(x)
    p_hub = float(p_first if hub == first else p_second)
    if second == hub:  # pair (x1, a): accept x1 w.p. pi1(x1)/q(x1) = min(1, p/q)
        p_x, q_x = float(p_first), float(q_first)
        if rng.bernoulli(1.0 if p_x >= q_x else p_x / q_x):
            return 0, None, 0
        _check_hub(draft_rows, node, hub, first, second)
        ids, target, draft, hub_at = _on_support(target_rows, draft_rows, node, hub)
        r2 = _r2(target, draft, hub_at, hub_mass)
        a1 = min(p_hub, _r1(target, draft, hub_at, hub_mass, ratio_hub))
        hub_target = p_hub if literal else p_hub - a1  # literal: p'(a) never updated here
        a2 = min(hub_target, r2)
        if rng.bernoulli(a2 / r2 if r2 > 0.0 else 0.0):
            return 1, None, 0
        a2_final = a2
    else:  # pair (a, x2): accept x2 w.p. pi2(x2)/Q(a, x2)
        p_x, q_x = float(p_second), float(q_second)
        pair_mass = ratio_hub * q_x
        if rng.bernoulli(min(max(p_x - q_x, 0.0), pair_mass) / pair_mass):
            return 1, None, 0
        _check_hub(draft_rows, node, hub, first, second)
        ids, target, draft, hub_at = _on_support(target_rows, draft_rows, node, hub)
        r1 = _r1(target, draft, hub_at, hub_mass, ratio_hub)
        a1 = min(p_hub, r1)
        if rng.bernoulli(a1 / r1 if r1 > 0.0 else 0.0):
            return 0, None, 0
        r2 = _r2(target, draft, hub_at, hub_mass)
        a2_final = min(p_hub - a1, r2)
    weights = draft * -(1.0 + ratio_hub)  # [[p - q]_+ - Q(a, .)]_+ = [p - (1 + c) q]_+
    weights += target
    np.maximum(weights, 0.0, out=weights)
    if hub_at is not None:  # a outside S: p(a) = 0, so r(a) = 0 in both readings
        weights[hub_at] = p_hub if literal else max(p_hub - a1 - a2_final, 0.0)
    mass = weights.sum()
    if not mass > RESIDUAL_MASS_GUARD:
        return None, kept_on_support(ids, target, guard=1), 0
    weights /= mass
    return None, kept_on_support(ids, weights), 0


def _on_support(target_rows: Rows, draft_rows: Rows, node: int, hub: int):
    """(ids, p over ids, q over ids, position of the hub in ids or None) at ``node``."""
    ids, target = target_rows.support(node)
    draft = draft_rows.gather(node, ids)
    hub_at = positions_of(ids, [hub])
    return ids, target, draft, (int(hub_at[0]) if len(hub_at) else None)


def _pair_hub(q_first: float, q_second: float, first: int, second: int) -> int:
    """The hub of a valid SpecHub pair in O(1) from the pair's draft probabilities: the pair holds
    the hub a = argmax q (lowest id on ties), and the other token has q <= q(a), with a lower id
    than a if it ties (§9.1)."""
    if first == second or max(q_first, q_second) >= 1.0:
        raise InvalidDraftError(
            f"SpecHub node has children ({first}, {second}) with q = ({q_first:.3g}, {q_second:.3g}); "
            "a pair holds two distinct tokens and q(hub) < 1: draw SPECHUB_PAIR trees with sample_spechub_pair"
        )
    if q_first != q_second:
        return first if q_first > q_second else second
    return min(first, second)


def _check_hub(draft_rows: Rows, node: int, hub: int, first: int, second: int) -> None:
    """Confirm the inferred hub is argmax q (the engine builds trees unvalidated); run only on the
    rejection branches."""
    found = draft_rows.argmax(node)
    if found != hub:
        raise InvalidDraftError(
            f"SpecHub node has children ({first}, {second}) but the hub is {found}; "
            "draw SPECHUB_PAIR trees with sample_spechub_pair"
        )


def _r1(target: np.ndarray, draft: np.ndarray, hub_at: int | None, hub_mass: float, ratio_hub: float) -> float:
    """R1 = sum_{x != a} (Q(a, x) - pi2(x)) = q(a) - sum_{x != a} min([p - q]_+, Q(a, x)), using
    min([p - q]_+, c q) = [min(p, (1 + c) q) - q]_+; target / draft over the target's support
    (pi2 = 0 outside it), hub_at the hub's position there or None."""
    pi2 = draft * (1.0 + ratio_hub)
    np.minimum(pi2, target, out=pi2)
    pi2 -= draft
    np.maximum(pi2, 0.0, out=pi2)
    return hub_mass - (float(pi2.sum()) - (float(pi2[hub_at]) if hub_at is not None else 0.0))


def _r2(target: np.ndarray, draft: np.ndarray, hub_at: int | None, hub_mass: float) -> float:
    """R2 = sum_{x != a} (q(x) - pi1(x)) = (1 - q(a)) - sum_{x != a} min(p(x), q(x)); pi1 = 0
    outside the target's support, and sum_{x != a} q(x) = 1 - q(a) carries the draft's mass
    outside it (target / draft over the support, hub_at the hub's position there or None)."""
    pi1 = np.minimum(target, draft)
    return (1.0 - hub_mass) - (float(pi1.sum()) - (float(pi1[hub_at]) if hub_at is not None else 0.0))


class SpecHub(Verifier):
    """SpecHub verification on SPECHUB_PAIR trees (§9.3, §13)."""

    name = "spechub"
    section = "§9"
    lossless = True
    supported_schemes = frozenset({DraftScheme.SPECHUB_PAIR})
    literal = False

    def _node_rule(self, rng: Rng, target: Rows, draft: Rows, node: int, tokens: Sequence[int]):
        if len(tokens) == 1:
            return _sd_rule(rng, target, draft, node, tokens)
        if len(tokens) == 2:
            return _pair_rule(rng, target, draft, node, tokens, self.literal)
        raise InvalidDraftError(f"SpecHub nodes have 1 or 2 children, got {len(tokens)}")

    def _verify(self, tree: DraftTree, rng: Rng) -> VerifyResult:
        return top_down(tree, rng, self._node_rule, raw_paths=False, reads_rows=True)


class SpecHubLiteral(SpecHub):
    """§9.4 negative control: the [SpecHub paper]'s literal pseudocode (App. B.1, Alg. 3):
    p'(a) updated only in the x1 = a branch, final residual with r(a) = p(a). NOT lossless."""

    name = "spechub-literal"
    section = "§9.4"
    lossless = False
    literal = True
