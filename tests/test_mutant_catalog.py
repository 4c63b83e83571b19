"""The mutant catalog is current: every mutant of ``tests/mutant_catalog`` still applies to the source.

``tests/mutants.py`` takes minutes per mutant and is run by hand, so a refactor that moves the text a
mutant edits would go unnoticed until the next run reports it NOT APPLIED. These checks only read
files (no mutant is applied to the package, none of their tests runs): each edit's old text occurs
exactly once in its file under ``src/verispec`` (edits applied in order, as the runner does), the new
text differs from the old, every listed test file (and ``::test`` function) exists, names are unique.
"""

from __future__ import annotations

import importlib
import pkgutil
import re
from pathlib import Path

import pytest

import tests.mutant_catalog as catalog
from tests.mutant_catalog import MUTANTS, PACKAGE, Mutant

ROOT = Path(__file__).resolve().parents[1]


def stale_edits(mutant: Mutant, root: Path = ROOT) -> list[str]:
    """What keeps ``mutant`` from applying to the sources under ``root``, edit by edit (runner's rule)."""
    texts: dict[str, str] = {}
    problems = []
    for relative, old, new in mutant.edits:
        path = root / PACKAGE / relative
        if relative not in texts:
            if not path.is_file():
                problems.append(f"{relative}: no such file under {PACKAGE}")
                continue
            texts[relative] = path.read_text(encoding="utf-8")
        if old == new:
            problems.append(f"{relative}: new text equals old text {old!r}")
        count = texts[relative].count(old)
        if count != 1:
            problems.append(f"{relative}: old text found {count} times: {old!r}")
        else:
            texts[relative] = texts[relative].replace(old, new)
    return problems


def missing_tests(mutant: Mutant, root: Path = ROOT) -> list[str]:
    problems = []
    for test in mutant.tests:
        file, *nodes = test.split("::")
        function = nodes[-1].split("[")[0] if nodes else ""
        path = root / file
        if not path.is_file():
            problems.append(f"{file}: no such test file")
        elif function and not re.search(rf"^\s*(async\s+)?def {re.escape(function)}\(", path.read_text(encoding="utf-8"), flags=re.M):
            problems.append(f"{test}: no such test function")
    return problems


def test_mutant_names_are_unique():
    names = [mutant.name for mutant in MUTANTS]
    assert len(names) == len(set(names)), sorted({name for name in names if names.count(name) > 1})


def test_every_catalog_module_is_in_mutants():
    modules = [name for _, name, _ in pkgutil.iter_modules(catalog.__path__) if name != "base"]
    listed = [mutant for name in modules for mutant in importlib.import_module(f"{catalog.__name__}.{name}").MUTANTS]
    assert sorted(m.name for m in listed) == sorted(m.name for m in MUTANTS)


@pytest.mark.parametrize("mutant", MUTANTS, ids=lambda mutant: mutant.name)
def test_mutant_applies_to_the_current_source(mutant):
    assert mutant.edits and mutant.tests
    problems = stale_edits(mutant) + missing_tests(mutant)
    assert not problems, f"mutant {mutant.name} is stale: " + "; ".join(problems)


def test_a_stale_mutant_is_reported(tmp_path):
    """The check can fail: an edit whose text is gone, or found twice, and a missing test are reported."""
    (tmp_path / PACKAGE).mkdir(parents=True)
    (tmp_path / PACKAGE / "rule.py").write_text("x = 1\ny = 2\ny = 2\n", encoding="utf-8")
    gone = Mutant("gone", "", (("rule.py", "x = 3", "x = 4"),), ("tests/test_rule.py",))
    twice = Mutant("twice", "", (("rule.py", "y = 2", "y = 3"),), ())
    fine = Mutant("fine", "", (("rule.py", "x = 1", "x = 0"), ("rule.py", "x = 0", "x = 5")), ())
    assert stale_edits(gone, tmp_path) == ["rule.py: old text found 0 times: 'x = 3'"]
    assert stale_edits(twice, tmp_path) == ["rule.py: old text found 2 times: 'y = 2'"]
    assert stale_edits(fine, tmp_path) == []
    assert missing_tests(gone, tmp_path) == ["tests/test_rule.py: no such test file"]
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_rule.py").write_text("def test_one():\n    pass\n", encoding="utf-8")
    named = Mutant("named", "", (), ("tests/test_rule.py::test_one", "tests/test_rule.py::test_two"))
    assert missing_tests(named, tmp_path) == ["tests/test_rule.py::test_two: no such test function"]
