"""Method names shared by the CLI, engine, bench and audit (DESIGN.md §3).

Each entry maps a name to its verifier and the draft it needs: ``chain`` (one path),
``paths`` (K i.i.d. paths: trie + raw paths) or ``tree`` (a token tree of a given shape, drawn
with ``tree_scheme``). Negative controls are the non-lossless readings that the test suite must
catch (ALGORITHMS.md §14.2); they are listed separately and never chosen by default.
"""

from __future__ import annotations

from dataclasses import dataclass

from verispec.core.tree import DraftScheme
from verispec.errors import ConfigError
from verispec.verify.base import Verifier
from verispec.verify.bv import BlockVerification
from verispec.verify.gbv_mod import GBVMod, GBVModWithoutModification
from verispec.verify.gmpbv import GreedyMultiPathBV
from verispec.verify.gumbel import GumbelCoupledVerification
from verispec.verify.nss import NaiveSpecInfer
from verispec.verify.otm import OTM
from verispec.verify.qfree import QFreeTreeVerification
from verispec.verify.rrs import RRS, RRSDeduplicated, RRSw
from verispec.verify.sd import SpeculativeSampling
from verispec.verify.spechub import SpecHub, SpecHubLiteral
from verispec.verify.spectr import SpecTr, SpecTrWrongSideRho
from verispec.verify.spectr_gbv import SpecTrGBVPublished, SpecTrGBVPublishedWithoutModification
from verispec.verify.spectr_gbv_star import SpecTrGBVStar
from verispec.verify.sprinter import Sprinter
from verispec.verify.traversal import TraversalVerification


@dataclass(frozen=True)
class MethodSpec:
    """A registered method: its verifier, the draft it needs and one line for humans.

    draft       'chain' | 'paths' | 'tree'
    tree_scheme how tree drafts are drawn (draft == 'tree')
    drafter_invariant  with a seed, the target's tokens are the seed's Gumbel-max draws
                (core.noise), so the text equals plain sampling's whatever the draft; the
                other rules draw with their own Rng and are exact in law only
    """

    name: str
    verifier: Verifier
    draft: str
    description: str
    tree_scheme: DraftScheme | None = None
    negative_control: bool = False
    drafter_invariant: bool = False

    @property
    def lossless(self) -> bool:
        return self.verifier.lossless

    @property
    def multi_draft(self) -> bool:
        return self.draft != "chain"


METHODS: dict[str, MethodSpec] = {
    spec.name: spec
    for spec in [
        MethodSpec("sd", SpeculativeSampling(), "chain", "token-wise speculative sampling (§2)"),
        MethodSpec("gumbel", GumbelCoupledVerification(), "chain", "Gumbel-coupled chain, drafter-invariant with a seed (Daliri et al. 2024)", drafter_invariant=True),
        MethodSpec("bv", BlockVerification(), "chain", "block verification, Sun et al. (§3)"),
        MethodSpec("gbv-mod", GBVMod(), "chain", "greedy block verification + target modification (§4)"),
        MethodSpec("spectr", SpecTr(), "paths", "SpecTr K-SEQ over K i.i.d. paths (§5)"),
        MethodSpec("spectr-gbv", SpecTrGBVPublished(), "paths", "SpecTr-GBV as published - NOT lossless for K>=2 (§6.1)"),
        MethodSpec("spectr-gbv-star", SpecTrGBVStar(), "paths", "SpecTr-GBV★, lossless repair with modification (§6.3)"),
        MethodSpec("gmpbv", GreedyMultiPathBV(), "paths", "greedy multi-path block verification (§7)"),
        MethodSpec("rrs", RRS(), "paths", "recursive rejection sampling, with replacement (§8)", DraftScheme.IID_TREE),
        MethodSpec("rrsw", RRSw(), "paths", "recursive rejection sampling, without replacement (§8)", DraftScheme.WITHOUT_REPLACEMENT),
        MethodSpec("spechub", SpecHub(), "tree", "SpecHub, K = 2 hub pairs, corrected (§9)", DraftScheme.SPECHUB_PAIR),
        MethodSpec("nss", NaiveSpecInfer(), "paths", "SpecInfer naive sampling on a token tree (§13)", DraftScheme.WITHOUT_REPLACEMENT, drafter_invariant=True),
        MethodSpec("qfree", QFreeTreeVerification(), "tree", "q-free walk over deterministic candidate trees (token trees), exact at any T (§13)", DraftScheme.DETERMINISTIC, drafter_invariant=True),
        MethodSpec("traversal", TraversalVerification(), "paths", "traversal verification (§12)", DraftScheme.WITHOUT_REPLACEMENT),
        MethodSpec("otm", OTM(), "paths", "optimal transport LP per position, small-V reference (§10)"),
        MethodSpec("sprinter", Sprinter(), "chain", "SPRINTER with a learned verifier - lossy (§11)"),
    ]
}

NEGATIVE_CONTROLS: dict[str, MethodSpec] = {
    spec.name: spec
    for spec in [
        MethodSpec("gbv-mod-nomod", GBVModWithoutModification(), "chain", "GBV-mod without its modification (§4.4)", negative_control=True),
        MethodSpec("spectr-gbv-nomod", SpecTrGBVPublishedWithoutModification(), "paths", "SpecTr-GBV as published, modification dropped (§6.2)", negative_control=True),
        MethodSpec("rrs-dedup", RRSDeduplicated(), "paths", "RRS formulas on deduplicated i.i.d. candidates (§8.1 pitfall)", negative_control=True),
        MethodSpec("spechub-literal", SpecHubLiteral(), "tree", "SpecHub's literal pseudocode (§9.4)", DraftScheme.SPECHUB_PAIR, negative_control=True),
        MethodSpec("spectr-wrong-rho", SpecTrWrongSideRho(), "paths", "K-SEQ with rho below the root (§5.1, §14.2)", negative_control=True),
    ]
}


def get_method(name: str, allow_controls: bool = False) -> MethodSpec:
    """Look a method up by name; unknown names raise ConfigError listing the valid ones."""
    if name in METHODS:
        return METHODS[name]
    if allow_controls and name in NEGATIVE_CONTROLS:
        return NEGATIVE_CONTROLS[name]
    valid = ", ".join(list(METHODS) + (list(NEGATIVE_CONTROLS) if allow_controls else []))
    raise ConfigError(f"unknown method {name!r}; choose one of: {valid}")
