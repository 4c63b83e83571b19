"""Gumbel-coupled speculative sampling: drafter-invariant chains (Daliri, Musco, Suresh 2024,
"Coupling without communication and drafter-invariant speculative decoding").

Rule. Let G(t, x) be the seed's i.i.d. standard Gumbel noise at absolute position t
(``core.noise``). The draft chain is drawn with it (``draft.samplers.sample_gumbel_chain``):
x_t = argmax_x log q(x | x_<t) + G(t, x). Verification walks the chain: at the node of depth d
(position t) the target's token is y_t = argmax_x log p(x | prefix) + G(t, x); keep x_t while it
equals y_t; at the first mismatch emit y_t; after a fully accepted chain emit the target's
Gumbel-max at the next position (the bonus). Temperature / top-k / top-p are applied to p and q
before the draws (T = 0: the argmax).

Lossless and drafter-invariant. Every emitted token is y_t = argmax log p(.|y_<t) + G(t), the
token plain sampling (``method="ar"``) draws at t with the same seed: a kept draft token equals
it by the acceptance test, the emitted one is it by definition. So the text is a deterministic
function of (seed, target), the same for every draft; and since the G(t, .) are i.i.d. Gumbel and
independent across t, y_t ~ p(.|y_<t) exactly (Gumbel-max trick), so the law is the target's.

Acceptance. For one position, X = argmax log q + G and Y = argmax log p + G share G, and
P(X = Y) >= (1 - TV(p, q)) / (1 + TV(p, q)) (Daliri et al.). Proof: as exponential races
(X = argmin E_z / q_z, Y = argmin E_z / p_z, E_z i.i.d. Exp(1)), X = Y = x whenever x wins both races, and
P(X = Y = x) = 1 / sum_z max(p_z / p_x, q_z / q_x) >= min(p_x, q_x) / sum_z max(p_z, q_z), whose sum over x
is (1 - TV) / (1 + TV). Speculative sampling's optimal coupling reaches 1 - TV, but needs the
draft's randomness to be coordinated by the verifier; this coupling needs nothing but the shared
seed, which is what makes it drafter-invariant.

With a plain ``Rng`` (the exact-enumeration tests, ``verispec audit``) the rule has no noise to
share: the chain is then an ordinary q-sample and the walk draws y ~ p through the Rng (the q-free
walk on a chain), exact in law but with acceptance sum_x p(x) q(x) per step instead.
"""

from __future__ import annotations

from verispec.core.noise import NoiseAt
from verispec.core.rng import Rng
from verispec.core.tree import DraftScheme, DraftTree
from verispec.errors import ConfigError
from verispec.verify.base import VerifyResult
from verispec.verify.qfree import QFreeTreeVerification


class GumbelCoupledVerification(QFreeTreeVerification):
    """Verification of a Gumbel-coupled chain: the q-free walk along it, drawing the target's
    tokens from the shared noise (a ``NoiseAt``) or, with an ``Rng``, exactly in law."""

    name = "gumbel"
    section = "docs/drafter-invariance.md"
    lossless = True
    supported_schemes = frozenset({DraftScheme.CHAIN})

    def _verify(self, tree: DraftTree, rng: Rng | NoiseAt) -> VerifyResult:
        if tree.draft.vocab_size != tree.target.vocab_size:
            raise ConfigError(
                f"the draft's rows have {tree.draft.vocab_size} tokens but the target's have {tree.target.vocab_size}; "
                "the gumbel rule couples draft and target through one noise per token id, so both need one vocabulary"
            )
        return super()._verify(tree, rng)
