"""MkDocs hook: reference tables generated from the code at build time, and a check of the built pages.

The page ``reference/cli.md`` holds the marker below; every build replaces it with one section per
subcommand (nested ones included), each with the subcommand's one-line help and its full ``--help``
text, taken from ``verispec.cli.main.build_parser``. The reference therefore cannot fall behind the
parsers: a new subcommand or flag appears at the next ``make docs``. ``tests/test_docs.py`` checks
that the generator covers every subparser. Likewise ``rules/index.md``'s registry table is read from
``verispec.verify.registry`` (name, lossless, draft kind, accepted draft schemes, description).
"""

from __future__ import annotations

import argparse
import html
import logging
import os
import re
import sys
from contextlib import contextmanager
from pathlib import Path

MARKER = "<!-- verispec-cli-reference -->"
RULES_MARKER = "<!-- verispec-rules-table -->"
HELP_WIDTH = "100"  # argparse wraps --help at $COLUMNS; fixed so the page is the same on every machine
SOURCE_DIR = Path(__file__).resolve().parents[2] / "src"
# Internal tracker numbers mean nothing to a reader; the built pages (docstrings and CLI help
# included) must not contain any. tests/test_docs.py uses the same pattern on the sources.
ISSUE_NUMBER = re.compile(r"\bissues? #?\d+", re.IGNORECASE)
log = logging.getLogger("mkdocs.plugins.verispec")


def _subparsers(parser: argparse.ArgumentParser) -> list[tuple[str, str, argparse.ArgumentParser]]:
    """(name, one-line help, parser) of each direct subcommand of ``parser``, in definition order."""
    found = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {choice.dest: choice.help or "" for choice in action._choices_actions}
            found.extend((name, helps.get(name, ""), sub) for name, sub in action.choices.items())
    return found


def walk_subcommands(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()):
    """Yield (path, one-line help, parser) for every subcommand at any depth, parents first."""
    for name, summary, sub in _subparsers(parser):
        yield (*path, name), summary, sub
        yield from walk_subcommands(sub, (*path, name))


@contextmanager
def _help_width():
    previous = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = HELP_WIDTH
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = previous


def cli_reference_markdown(parser: argparse.ArgumentParser) -> str:
    """Markdown with one section per subcommand of ``parser``: heading, summary, ``--help`` text."""
    with _help_width():
        parts = ["## Overview", "", "```text", parser.format_help().rstrip(), "```", ""]
        for path, summary, sub in walk_subcommands(parser):
            heading = "#" * min(len(path) + 1, 4)
            parts += [f"{heading} `{parser.prog} {' '.join(path)}`", ""]
            if summary:
                parts += [summary[0].upper() + summary[1:] + ("" if summary.endswith(".") else "."), ""]
            parts += ["```text", sub.format_help().rstrip(), "```", ""]
    return "\n".join(parts)


def verispec_parser() -> argparse.ArgumentParser:
    """The CLI's parser, imported from this checkout's ``src/`` (not from whatever is installed)."""
    return _import_from_checkout("verispec.cli.main").build_parser()


def _import_from_checkout(module: str):
    if str(SOURCE_DIR) not in sys.path:
        sys.path.insert(0, str(SOURCE_DIR))
    return __import__(module, fromlist=["_"])


def rules_table_markdown() -> str:
    """The registry as a Markdown table: every rule, then every negative control."""
    registry = _import_from_checkout("verispec.verify.registry")
    rows = ["| name | lossless | draft kind | draft schemes it accepts | class | description |", "|---|---|---|---|---|---|"]
    for specs in (registry.METHODS, registry.NEGATIVE_CONTROLS):
        for spec in specs.values():
            schemes = ", ".join(sorted(scheme.value for scheme in spec.verifier.supported_schemes))
            name = f"`{spec.name}`" + (" (negative control)" if spec.negative_control else "")
            rows.append(f"| {name} | {'yes' if spec.lossless else '**no**'} | {spec.draft} | {schemes} | "
                        f"`{type(spec.verifier).__name__}` | {spec.description} |")
    return "\n".join(rows)


def on_page_markdown(markdown: str, page, config, files) -> str:
    if MARKER in markdown:
        markdown = markdown.replace(MARKER, cli_reference_markdown(verispec_parser()))
    if RULES_MARKER in markdown:
        markdown = markdown.replace(RULES_MARKER, rules_table_markdown())
    return markdown


def issue_numbers_in_html(text: str) -> list[str]:
    """Each internal issue number in a built page's visible text (tags stripped), with context."""
    visible = html.unescape(re.sub(r"<[^>]+>", " ", text))
    return [" ".join(visible[max(0, m.start() - 60): m.end()].split()) for m in ISSUE_NUMBER.finditer(visible)]


def on_post_page(output: str, page, config) -> str:
    # a warning fails `mkdocs build --strict`: a docstring or help text that names an issue
    # number shows up on a page, and is fixed at its source
    for context in issue_numbers_in_html(output):
        log.warning("%s shows an internal issue number: ...%s", page.file.src_uri, context)
    return output
