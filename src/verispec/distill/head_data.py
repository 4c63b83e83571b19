"""Feature shards for training EAGLE-3 heads: one teacher-forced fp32 target forward
per sequence gives every position's head input features and the teacher distribution, stored so
that training never re-runs the target.

Inputs: ``distill.data`` record shards (prompt + the target's own continuation; their stored
teacher rows are ignored and recomputed for every position) and plain text files cut into chunks
of at most ``context`` tokens. One output shard per input shard (records) or per group of chunks
(text), named after its source; an existing output shard is skipped, so a build resumes and a
rescan picks up only new inputs.

One feature record per sequence of n tokens (a dict of tensors):
    tokens       (n,) int32
    features     (n, len(aux) * H_t) float16 (bfloat16 when a value overflows float16)
                 features[j] = cat_i HF hidden_states[i][j] (``models.eagle_head.target_features``)
    topk_ids     (n, k) int32     row j: the target's top-k next tokens after tokens[:j + 1]
    topk_logits  (n, k) float16   their raw logits
    lse, lse_eval (n,) float32    log-sum-exp of the raw logits at temperature 1 / eval_temperature
    prompt_len   int              0 for text chunks
    prompt_id    str              "category:id" of the prompt, or "text:<file>#<chunk>"
Head entry j pairs features[j] with tokens[j + 1] and is trained on teacher row j + 1.
"""

from __future__ import annotations

import glob
import hashlib
import random
import warnings
from collections.abc import Sequence
from pathlib import Path

import torch

from verispec.bench.datasets import Prompt
from verispec.distill.data import compress_logits, is_heldout, save_shard
from verispec.errors import ConfigError
from verispec.models.eagle_head import target_features

FLOAT16_LIMIT = 65000.0


def prompt_is_heldout(prompt_id: str) -> bool:
    """True for a record of a held-out prompt ("humaneval:HumanEval/3", "qa:335", ...);
    text chunks and ids without a known category are not prompts of the split."""
    category, _, ident = str(prompt_id).partition(":")
    if not ident or category == "text":
        return False
    try:
        return is_heldout(Prompt(ident, category, ""))
    except ValueError:
        return False


def _store_features(features: torch.Tensor) -> torch.Tensor:
    """float16 unless a value would overflow it (then bfloat16: same range as float32)."""
    if float(features.abs().max()) < FLOAT16_LIMIT:
        return features.to(torch.float16)
    return features.to(torch.bfloat16)


@torch.no_grad()
def feature_record(target, tokens: torch.Tensor, aux_layer_ids, *, top_k: int, eval_temperature: float,
                   prompt_len: int, prompt_id: str) -> dict:
    """One teacher-forced forward over ``tokens`` (n,) -> a feature record (module docstring)."""
    device = next(target.parameters()).device
    ids = torch.as_tensor(tokens, dtype=torch.long)[None].to(device)
    features, logits = target_features(target, ids, aux_layer_ids)
    record = compress_logits(logits[0].cpu(), top_k, eval_temperature)
    record.update(
        tokens=ids[0].cpu().to(torch.int32),
        features=_store_features(features[0].cpu()),
        prompt_len=int(prompt_len),
        prompt_id=str(prompt_id),
    )
    return record


def _shard_meta(target, aux_layer_ids, top_k, eval_temperature, source) -> dict:
    config = getattr(target, "config", None)
    return {
        "aux_layer_ids": [int(i) for i in aux_layer_ids],
        "top_k": int(top_k),
        "eval_temperature": float(eval_temperature),
        "source": str(source),
        "target": getattr(config, "_name_or_path", "") if config is not None else "",
    }


def record_shard_inputs(record_dirs: Sequence[str | Path], pattern: str = "*.pt") -> list[Path]:
    """The distill.data shards of ``record_dirs`` (sorted by name within each directory); an error
    when there is none at all."""
    paths: list[Path] = []
    for directory in record_dirs:
        directory = Path(directory)
        if not directory.is_dir():
            raise ConfigError(f"record directory {str(directory)!r} not found; pass a directory of distill.data shards "
                              "(written by `verispec distill --data-only`)")
        paths += sorted(directory.glob(pattern))
    if not paths:
        raise ConfigError(f"no record shard (*.pt) in {[str(d) for d in record_dirs]}; write some with "
                          "`verispec distill --data-only` first")
    return paths


def _output_name(path: Path) -> str:
    tag = hashlib.sha1(str(path.resolve().parent).encode()).hexdigest()[:8]
    return f"feat-{tag}-{path.stem}.pt"


def build_record_features(target, record_dirs: Sequence[str | Path], out_dir: str | Path, aux_layer_ids, *,
                          top_k: int = 64, eval_temperature: float = 0.6, max_tokens: int = 1024,
                          allow_heldout: bool = False, progress: bool = True) -> dict:
    """Feature shards for every distill.data shard in ``record_dirs`` not converted yet.

    allow_heldout False (training data): records of held-out prompts are dropped (counted).
    allow_heldout True (evaluation data): kept. Sequences are cut to their first ``max_tokens``.
    Returns counts {"shards", "records", "positions", "dropped_heldout"} of the new shards."""
    from tqdm import tqdm

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    counts = {"shards": 0, "records": 0, "positions": 0, "dropped_heldout": 0}
    todo = [p for p in record_shard_inputs(record_dirs) if not (out_dir / _output_name(p)).is_file()]
    for path in tqdm(todo, desc="head features (records)", disable=not progress or not todo):
        try:
            records = torch.load(path, weights_only=False)["records"]
        except Exception as error:  # a shard being written right now (or damaged): retry on the next scan
            warnings.warn(f"skipping unreadable record shard {path}: {error}", stacklevel=2)
            continue
        out = []
        for record in records:
            prompt_id = str(record.get("prompt_id", ""))
            if not allow_heldout and prompt_is_heldout(prompt_id):
                counts["dropped_heldout"] += 1
                continue
            tokens = record["tokens"][:max_tokens]
            if len(tokens) < 3:
                continue
            out.append(feature_record(target, tokens, aux_layer_ids, top_k=top_k, eval_temperature=eval_temperature,
                                      prompt_len=int(record.get("prompt_len", 0)), prompt_id=prompt_id))
        save_shard(out_dir / _output_name(path), out, _shard_meta(target, aux_layer_ids, top_k, eval_temperature, path))
        counts["shards"] += 1
        counts["records"] += len(out)
        counts["positions"] += sum(len(r["tokens"]) for r in out)
    return counts


def text_chunks(tokenizer, pattern: str, context: int, max_tokens: int, seed: int = 0, min_chunk: int = 32) -> list[tuple[str, list[int]]]:
    """Files matching ``pattern`` (a glob, ``**`` recursive), in a seeded order, tokenised without
    special tokens and cut into chunks of at most ``context`` tokens, until ``max_tokens`` tokens.
    Returns [(name "file#chunk", ids)]."""
    files = sorted(f for f in glob.glob(pattern, recursive=True) if Path(f).is_file())
    if not files:
        raise ConfigError(f"--text-files {pattern!r} matches no file; pass a glob such as '/usr/lib/python3*/**/*.py'")
    random.Random(seed).shuffle(files)
    chunks, total = [], 0
    for name in files:
        try:
            text = Path(name).read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        ids = tokenizer.encode(text, add_special_tokens=False)
        for index, start in enumerate(range(0, len(ids), context)):
            piece = ids[start : start + context]
            if len(piece) < min(min_chunk, context):
                continue
            chunks.append((f"{name}#{index}", piece))
            total += len(piece)
            if total >= max_tokens:
                return chunks
    return chunks


def build_text_features(target, tokenizer, pattern: str, out_dir: str | Path, aux_layer_ids, *, context: int = 512,
                        max_tokens: int = 100_000, shard_tokens: int = 16_384, top_k: int = 64,
                        eval_temperature: float = 0.6, seed: int = 0, progress: bool = True) -> dict:
    """Feature shards of plain text (``text_chunks``), ``shard_tokens`` tokens a shard, named by the
    glob, seed, context and index (a rerun with the same arguments skips what exists)."""
    from tqdm import tqdm

    if tokenizer is None:
        raise ConfigError("--text-files needs the target's tokenizer")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    chunks = text_chunks(tokenizer, pattern, context, max_tokens, seed)
    groups: list[list[tuple[str, list[int]]]] = [[]]
    size = 0
    for chunk in chunks:
        if size >= shard_tokens:
            groups.append([])
            size = 0
        groups[-1].append(chunk)
        size += len(chunk[1])
    tag = hashlib.sha1(f"{pattern}|{seed}|{context}|{max_tokens}".encode()).hexdigest()[:8]
    counts = {"shards": 0, "records": 0, "positions": 0, "dropped_heldout": 0}
    todo = [(i, g) for i, g in enumerate(groups) if g and not (out_dir / f"text-{tag}-{i:04d}.pt").is_file()]
    for index, group in tqdm(todo, desc="head features (text)", disable=not progress or not todo):
        out = [
            feature_record(target, torch.tensor(ids), aux_layer_ids, top_k=top_k, eval_temperature=eval_temperature,
                           prompt_len=0, prompt_id=f"text:{name}")
            for name, ids in group
        ]
        save_shard(out_dir / f"text-{tag}-{index:04d}.pt", out,
                   _shard_meta(target, aux_layer_ids, top_k, eval_temperature, pattern))
        counts["shards"] += 1
        counts["records"] += len(out)
        counts["positions"] += sum(len(r["tokens"]) for r in out)
    return counts


def feature_shard_paths(directory: str | Path) -> list[Path]:
    return sorted(Path(directory).glob("*.pt"))


def load_feature_shards(paths: Sequence[Path], aux_layer_ids=None, allow_heldout: bool = False) -> list[dict]:
    """Records of the given feature shards. Refuses shards built for other aux layers and, unless
    ``allow_heldout``, any record of a held-out prompt (training data must never hold one)."""
    records = []
    for path in paths:
        shard = torch.load(path, weights_only=False)
        meta = shard.get("meta", {})
        if aux_layer_ids is not None and "aux_layer_ids" in meta and list(meta["aux_layer_ids"]) != [int(i) for i in aux_layer_ids]:
            raise ConfigError(f"feature shard {path} holds aux layers {meta['aux_layer_ids']}, the head needs "
                              f"{list(aux_layer_ids)}; rebuild the features into a fresh directory")
        for record in shard["records"]:
            if not allow_heldout and prompt_is_heldout(record.get("prompt_id", "")):
                raise ConfigError(f"feature shard {path} holds held-out prompt {record['prompt_id']!r}: training data "
                                  "must not contain held-out prompts; rebuild it without them")
            records.append(record)
    return records
