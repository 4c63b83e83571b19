"""The README and the documentation site: short README, no internal tracker numbers, and reference
pages that cover every CLI subcommand and every rule of the registry.

The command-line reference is generated at build time by ``docs/hooks/reference.py`` (an MkDocs
hook); these tests check that its generator covers every subparser, walked here independently.
"""

from __future__ import annotations

import argparse
import importlib.util
import re
from pathlib import Path

import pytest

from verispec.cli.main import build_parser
from verispec.verify.registry import METHODS, NEGATIVE_CONTROLS

ROOT = Path(__file__).resolve().parents[1]
README_MAX_LINES = 220
ISSUE_NUMBER = re.compile(r"\bissues? #?\d+", re.IGNORECASE)


def load_hook():
    spec = importlib.util.spec_from_file_location("verispec_docs_hook", ROOT / "docs" / "hooks" / "reference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def user_facing_texts() -> list[Path]:
    return [ROOT / "README.md", ROOT / "mkdocs.yml", *sorted((ROOT / "docs").rglob("*.md"))]


def every_subcommand(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> dict[tuple[str, ...], argparse.ArgumentParser]:
    found = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found[(*path, name)] = sub
                found.update(every_subcommand(sub, (*path, name)))
    return found


def test_readme_is_short():
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines; move detail into docs/ (limit {README_MAX_LINES})"


@pytest.mark.parametrize("path", user_facing_texts(), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_internal_issue_numbers(path):
    text = path.read_text(encoding="utf-8")
    hits = [f"line {text.count(chr(10), 0, m.start()) + 1}: {m.group(0)!r}" for m in ISSUE_NUMBER.finditer(text)]
    assert not hits, f"{path.relative_to(ROOT)} names internal issue numbers a reader cannot look up: {hits}"


def test_issue_pattern_matches_the_forms_it_must_refuse():
    for text in ("issue 12", "Issue #3", "issues 13 and 15", "(issue 16)"):
        assert ISSUE_NUMBER.search(text), text
    for text in ("issues", "an issue with 3 rules", "tissue 5"):
        assert not ISSUE_NUMBER.search(text), text


def test_cli_reference_covers_every_subcommand():
    parser = build_parser()
    hook = load_hook()
    markdown = hook.cli_reference_markdown(parser)
    subcommands = every_subcommand(parser)
    assert len(subcommands) >= 13  # generate ... serve, and the nested sprinter / theory / draft ones
    assert [path for path, _, _ in hook.walk_subcommands(parser)] == list(subcommands)
    for path, sub in subcommands.items():
        assert f"`verispec {' '.join(path)}`" in markdown, f"no reference section for verispec {' '.join(path)}"
        for action in sub._actions:
            for flag in action.option_strings:
                assert flag in markdown, f"verispec {' '.join(path)} {flag} is missing from the CLI reference"


def test_cli_reference_page_and_hook_are_wired_into_the_build():
    hook = load_hook()
    assert hook.MARKER in (ROOT / "docs" / "reference" / "cli.md").read_text(encoding="utf-8")
    assert hook.RULES_MARKER in (ROOT / "docs" / "rules" / "index.md").read_text(encoding="utf-8")
    assert "docs/hooks/reference.py" in (ROOT / "mkdocs.yml").read_text(encoding="utf-8")


def test_generated_rules_table_lists_every_rule_and_control():
    table = load_hook().rules_table_markdown()
    for name, spec in {**METHODS, **NEGATIVE_CONTROLS}.items():
        assert f"| `{name}`" in table and type(spec.verifier).__name__ in table, name


def test_every_rule_has_a_family_page():
    pages = {path.name: path.read_text(encoding="utf-8") for path in (ROOT / "docs" / "rules").glob("*.md") if path.name != "index.md"}
    for name in METHODS:
        assert any(f"`{name}`" in text for text in pages.values()), f"rule {name!r} is on no page under docs/rules/"


def test_build_check_finds_issue_numbers_in_rendered_pages():
    hook = load_hook()
    assert hook.issue_numbers_in_html("<p>Token trees (<code>issue 12</code>)</p>")
    assert not hook.issue_numbers_in_html("<p>issues are tracked elsewhere</p>")
