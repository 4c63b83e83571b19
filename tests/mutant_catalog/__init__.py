"""The mutants that ``tests/mutants.py`` applies and runs, one module per layer of ``src/verispec``
(the layer of the code a mutant edits), and in each module one section per rule or subject:

    verify.py   the verification rules: greedy selection and q̃, SD / BV / GMPBV, GBV-mod / ★ and
                the modification windows, RRS, SpecTr, SpecHub, traversal, NSS / q-free, supports
    core.py     the draft tree's validation, the lazy row providers, the seeded Gumbel noise
    bench.py    replay of recorded drafts, the claims table's per-chain expectations
    engine.py   the batch budget, the batch engine, the cost model, acceptance estimates, sibling
                ranks, resting rounds (engine/ and draft/)
    models.py   llama.cpp batches, the batch runner and padded head step, batch invariance

A new mutant goes next to the mutants of the same rule. ``tests/test_mutant_catalog.py`` checks,
without running any mutant, that every edit still matches its source exactly once.
"""

from __future__ import annotations

from . import bench, core, engine, models, verify
from .base import PACKAGE, Mutant

MUTANTS: list[Mutant] = [*verify.MUTANTS, *core.MUTANTS, *bench.MUTANTS, *engine.MUTANTS, *models.MUTANTS]

__all__ = ["MUTANTS", "PACKAGE", "Mutant"]
