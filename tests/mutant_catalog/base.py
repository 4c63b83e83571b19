"""The ``Mutant`` record of the mutation check (tests/mutants.py runs it; the modules of this
package list the mutants) and the test files that more than one catalog module names."""

from __future__ import annotations

from dataclasses import dataclass

PACKAGE = "src/verispec"  # every edit names a file under this folder of the repository

BLOCK = "tests/verify/test_block_rules.py"
TREE_TESTS = "tests/core/test_tree.py"
BATCH_DRAFT_TESTS = "tests/engine/test_batch_draft_model.py"


@dataclass(frozen=True)
class Mutant:
    name: str
    description: str
    edits: tuple[tuple[str, str, str], ...]  # (file under src/verispec, old text, new text)
    tests: tuple[str, ...]
