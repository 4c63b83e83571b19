"""Configuration of a benchmark sweep: flags, or a YAML / TOML file with the same keys.

A sweep runs every method x dataset x K x L x temperature x seed for one target/draft pair,
plus the plain-decoding baseline ``ar`` per dataset x temperature x seed. Keys (file or flags;
``-`` and ``_`` are interchangeable; lists may be given as lists or as comma-separated strings):

    methods         registry names, e.g. [sd, bv, spectr]             (--methods)
    dataset         'humaneval' and/or Spec-Bench-format JSONL paths (--dataset, repeatable)
    limit           prompts per dataset (per category for Spec-Bench files) (--limit)
    K, L            numbers of drafts and draft lengths               (-K, -L)
    temperatures    0 = greedy                                         (--temperatures)
    max_new_tokens, seeds, out, target, draft, dtype, device, backend, threads, top_k, top_p, chat,
    record, record_limit, record_per_prompt, anchor, warmup, progress
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import yaml

from verispec.bench.datasets import HUMANEVAL, check_dataset_spec
from verispec.errors import ConfigError
from verispec.models import check_backend
from verispec.verify.registry import get_method

BASELINE = "ar"
DTYPES = ("auto", "fp32", "bf16", "fp16")  # auto: models.default.fast_dtype_name

# Alternative spellings accepted in config files, mapped to the field name.
ALIASES = {
    "datasets": "dataset",
    "method": "methods",
    "k": "K",
    "num_drafts": "K",
    "l": "L",
    "draft_len": "L",
    "draft_lens": "L",
    "temperature": "temperatures",
    "seed": "seeds",
    "output": "out",
}


@dataclass
class BenchConfig:
    """One sweep. ``methods`` excludes the baseline 'ar', which always runs."""

    methods: list[str] = field(default_factory=lambda: ["qfree"])  # target-aware token trees (the default draft)
    dataset: list[str] = field(default_factory=lambda: [HUMANEVAL])
    limit: int | None = 10
    K: list[int] = field(default_factory=lambda: [1])
    L: list[int] = field(default_factory=lambda: [4])
    temperatures: list[float] = field(default_factory=lambda: [0.0])
    max_new_tokens: int = 128
    seeds: list[int] = field(default_factory=lambda: [0])
    out: str = "bench_out"
    target: str | None = None
    draft: str | None = None
    dtype: str = "auto"
    device: str = "cpu"
    backend: str = "auto"  # model forward of the adapters: auto | native | transformers (models.hf)
    threads: int | None = None  # torch CPU threads (None: torch's default)
    top_k: int = 0
    top_p: float = 1.0
    chat: bool = True
    record: bool = False
    record_limit: int = 32
    record_per_prompt: int | None = None  # rounds recorded per prompt (None: no per-prompt cap)
    anchor: bool = False
    warmup: bool = True
    progress: bool = True

    def validate(self) -> "BenchConfig":
        """Check every value; raise ConfigError naming the bad one. Returns self."""
        if not self.methods:
            raise ConfigError("no methods given; use e.g. --methods sd,bv")
        for method in self.methods:
            get_method(method)  # raises ConfigError naming an unknown method
        if not self.dataset:
            raise ConfigError("no dataset given; use --dataset humaneval or a Spec-Bench JSONL path")
        for spec in self.dataset:
            check_dataset_spec(spec)
        if self.limit is not None and self.limit < 1:
            raise ConfigError(f"limit must be >= 1 (or omitted for all prompts), got {self.limit}")
        for name in ("K", "L", "seeds", "temperatures"):
            if not getattr(self, name):
                raise ConfigError(f"{name} is empty; give at least one value")
        for name in ("K", "L"):
            bad = [value for value in getattr(self, name) if value < 1]
            if bad:
                raise ConfigError(f"{name} values must be >= 1, got {bad}")
        if any(t < 0 for t in self.temperatures):
            raise ConfigError(f"temperatures must be >= 0 (0 = greedy), got {self.temperatures}")
        if self.max_new_tokens < 1:
            raise ConfigError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.dtype not in DTYPES:
            raise ConfigError(f"dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}")
        check_backend(self.backend)
        if self.threads is not None and self.threads < 1:
            raise ConfigError(f"threads must be >= 1, got {self.threads}")
        if self.record_limit < 1:
            raise ConfigError(f"record_limit must be >= 1, got {self.record_limit}")
        if self.record_per_prompt is not None and self.record_per_prompt < 1:
            raise ConfigError(f"record_per_prompt must be >= 1 (or unset), got {self.record_per_prompt}")
        return self


def _as_list(value, convert, key: str) -> list:
    if isinstance(value, str):
        value = [item.strip() for item in value.split(",") if item.strip()]
    elif not isinstance(value, (list, tuple)):
        value = [value]
    items = []
    for item in value:
        if isinstance(item, str) and "," in item:
            items.extend(_as_list(item, convert, key))
            continue
        try:
            items.append(convert(item))
        except (TypeError, ValueError) as error:
            raise ConfigError(f"{key}: cannot read {item!r} as {convert.__name__}") from error
    return items


def _as_bool(value, key: str) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "yes", "1", "false", "no", "0"):
        return value.lower() in ("true", "yes", "1")
    raise ConfigError(f"{key}: expected true or false, got {value!r}")


def _convert(key: str, value, kind) -> Any:
    if key in ("methods", "dataset"):
        items = _as_list(value, str, key)
        if key == "methods":
            items = [m for m in dict.fromkeys(items) if m != BASELINE]  # the baseline always runs
        return items
    if key in ("K", "L", "seeds"):
        return _as_list(value, int, key)
    if key == "temperatures":
        return _as_list(value, float, key)
    if value is None:
        return None
    if "bool" in str(kind):
        return _as_bool(value, key)
    try:
        if "int" in str(kind):
            if isinstance(value, float) and value != int(value):
                raise ValueError
            return int(value)
        if "float" in str(kind):
            return float(value)
    except (TypeError, ValueError) as error:
        raise ConfigError(f"{key}: cannot read {value!r} as {kind}") from error
    return str(value)


def normalise_keys(values: dict) -> dict:
    """Map file / flag keys onto BenchConfig field names; unknown keys raise ConfigError."""
    names = {f.name: f for f in fields(BenchConfig)}
    out = {}
    for raw_key, value in values.items():
        key = str(raw_key).replace("-", "_")
        key = ALIASES.get(key.lower(), key) if key not in names else key
        if key not in names:
            raise ConfigError(f"unknown config key {raw_key!r}; valid keys: {', '.join(names)}")
        out[key] = _convert(key, value, names[key].type)
    return out


def _tomllib():
    try:
        import tomllib  # Python >= 3.11
    except ModuleNotFoundError:  # pragma: no cover - Python 3.10
        try:
            import tomli as tomllib
        except ModuleNotFoundError as error:
            raise ConfigError("TOML config files need Python >= 3.11 or the 'tomli' package") from error
    return tomllib


def read_config_file(path: str | Path) -> dict:
    """Raw key/value mapping of a YAML (.yaml/.yml) or TOML (.toml) file; a [bench] table or
    top-level 'bench' mapping is used when present."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file {str(path)!r} not found")
    text = path.read_text()
    suffix = path.suffix.lower()
    tomllib = _tomllib()
    try:
        if suffix == ".toml":
            data = tomllib.loads(text)
        elif suffix in (".yaml", ".yml"):
            data = yaml.safe_load(text) or {}
        else:
            raise ConfigError(f"config file {str(path)!r}: use a .yaml, .yml or .toml file")
    except (tomllib.TOMLDecodeError, yaml.YAMLError) as error:
        raise ConfigError(f"config file {str(path)!r} is not valid {suffix[1:].upper()}: {error}") from error
    if not isinstance(data, dict):
        raise ConfigError(f"config file {str(path)!r} must hold a mapping of keys to values")
    if isinstance(data.get("bench"), dict) and len(data) == 1:
        data = data["bench"]
    return data


def _resolve_dataset_paths(datasets: list[str], base: Path) -> list[str]:
    """Relative dataset paths of a config file: as given if they exist, else relative to the file."""
    resolved = []
    for spec in datasets:
        if spec != HUMANEVAL and not Path(spec).is_file() and (base / spec).is_file():
            spec = str(base / spec)
        resolved.append(spec)
    return resolved


def make_config(config_file: str | Path | None = None, overrides: dict | None = None) -> BenchConfig:
    """BenchConfig from defaults < config file < overrides (e.g. the flags given on the command
    line; None values are ignored), validated."""
    values: dict = {}
    if config_file is not None:
        values.update(normalise_keys(read_config_file(config_file)))
        if "dataset" in values:
            values["dataset"] = _resolve_dataset_paths(values["dataset"], Path(config_file).parent)
    values.update(normalise_keys({k: v for k, v in (overrides or {}).items() if v is not None}))
    return BenchConfig(**values).validate()
