"""Griffe extension for the API reference: keep the line structure of verispec's prose docstrings.

The docstrings list parameters and fields as ``name: description`` lines (no Google/NumPy
sections). Markdown would join those lines into one paragraph; this extension starts a new
paragraph at each such line so that every entry reads on its own line. It also leaves out
undocumented instance attributes (``self.x = x`` in ``__init__``), which the reference would
otherwise list as noise beside the documented members, properties and dataclass fields. Only the
rendered pages change, never the source.
"""

from __future__ import annotations

import re

import griffe

# "target: ...", "num_drafts (K), draft_len (L): ...", "step_callback(tree, result, step): ..."
ENTRY = re.compile(r"^[A-Za-z_`\"'][\w`\"'.\[\]() ,*/|=-]{0,59}:\s")
MAX_WORDS_IN_NAME = 6


def paragraph_per_entry(text: str) -> str:
    lines, fenced = [], False
    for line in text.split("\n"):
        if line.lstrip().startswith("```"):
            fenced = not fenced
        name = line.split(":", 1)[0]
        if (not fenced and lines and lines[-1].strip() and ENTRY.match(line)
                and len(name.split()) <= MAX_WORDS_IN_NAME and "://" not in line[:len(name) + 3]):
            lines.append("")
        lines.append(line)
    return "\n".join(lines)


class DocstringLines(griffe.Extension):
    def on_instance(self, *, node, obj, agent, **kwargs) -> None:
        if obj.docstring is not None:
            obj.docstring.value = paragraph_per_entry(obj.docstring.value)

    def on_class_members(self, *, node, cls, agent, **kwargs) -> None:
        # attributes assigned inside a method (``self.x = ...``), as opposed to dataclass / pydantic
        # fields declared in the class body, which stay (they are the class's documented shape)
        methods = [m for m in cls.members.values() if not m.is_alias and m.is_function and m.lineno and m.endlineno]
        for name, member in list(cls.members.items()):
            if member.is_alias or not member.is_attribute or member.docstring is not None or not member.lineno:
                continue
            if any(method.lineno <= member.lineno <= method.endlineno for method in methods):
                cls.del_member(name)
