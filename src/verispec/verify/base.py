"""The common interface of all verification rules (DESIGN.md §3).

A verifier is a pure function of a ``DraftTree`` and an ``Rng``: no model, no I/O, no state
carried between calls (target modifications travel in the result, ALGORITHMS.md §4.3).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar

from verispec.core.rng import Rng
from verispec.core.tree import DraftScheme, DraftTree
from verispec.errors import UnsupportedDraftSchemeError

if TYPE_CHECKING:
    from verispec.verify.modification import ModificationWindow


@dataclass(frozen=True)
class VerifyResult:
    """Output of one verification step: the accepted draft prefix and one extra token.

    accepted_node   node index whose root path is the accepted prefix x_{1:tau} (0 = nothing)
    accepted_tokens x_{1:tau}
    next_token      y: a correction token (tau < depth of the branch) or a bonus token
    is_bonus        True when y was drawn from p(.|accepted_node) after a full accept
    modification    for GBV-mod / SpecTr-GBV(★): the window that modifies the target in later
                    iterations (ALGORITHMS.md §4.3, §6.3); None when nothing is modified
    diagnostics     rule-specific counters, e.g. residual_guard_hits
    """

    accepted_node: int
    accepted_tokens: tuple[int, ...]
    next_token: int
    is_bonus: bool
    modification: "ModificationWindow | None" = None
    diagnostics: dict[str, float] = field(default_factory=dict)

    @property
    def accepted_len(self) -> int:
        return len(self.accepted_tokens)

    @property
    def output_tokens(self) -> tuple[int, ...]:
        return self.accepted_tokens + (self.next_token,)


class Verifier:
    """Base class: subclasses set the class attributes and implement ``_verify``."""

    name: ClassVar[str]
    section: ClassVar[str]  # the section of ALGORITHMS.md the rule implements
    lossless: ClassVar[bool]
    needs_target_modification: ClassVar[bool] = False
    supported_schemes: ClassVar[frozenset[DraftScheme]]

    def verify(self, tree: DraftTree, rng: Rng) -> VerifyResult:
        self.check_scheme(tree)
        return self._verify(tree, rng)

    def check_scheme(self, tree: DraftTree) -> None:
        if tree.scheme not in self.supported_schemes:
            allowed = ", ".join(sorted(s.value for s in self.supported_schemes))
            raise UnsupportedDraftSchemeError(
                f"verifier {self.name!r} is not exact on drafts drawn with scheme "
                f"{tree.scheme.value!r}; it needs one of: {allowed}. Draw the draft with a matching "
                "sampler (see verispec.draft) or pick another method."
            )

    def _verify(self, tree: DraftTree, rng: Rng) -> VerifyResult:  # pragma: no cover - abstract
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


def chain_nodes(tree: DraftTree) -> tuple[int, ...]:
    """The single path of a chain-shaped tree (root excluded)."""
    if tree.num_paths == 1:
        return tree.paths[0]
    return tree.path_to(tree.num_nodes - 1)


def result_at(tree: DraftTree, node: int, next_token: int, is_bonus: bool, **extra) -> VerifyResult:
    return VerifyResult(node, tree.tokens_to(node), int(next_token), is_bonus, **extra)
