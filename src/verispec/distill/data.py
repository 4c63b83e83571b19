"""Distillation data: target continuations of training prompts and the target's next-token
distributions on them, stored compactly (top-k logits + log-sum-exp per position).

Prompt split (never train on what is evaluated):
    training  : Spec-Bench question_id % 5 != 0, HumanEval tasks 40..163
    held-out  : Spec-Bench question_id % 5 == 0, HumanEval tasks 0..39
The main-job demo and the ``draft check`` defaults read held-out prompts only.

One record per sequence (a dict of tensors):
    tokens       (n_prompt + n_new,) int32   prompt then the target's continuation
    prompt_len   int
    target_start int                         first predicted token: prompt_len (continuation rows) or 1 (all)
    topk_ids     (n, k) int32                row j: the target's top-k next tokens after tokens[:target_start + j]
    topk_logits  (n, k) float16              their raw (temperature-1) logits
    lse          (n,) float32                log-sum-exp of the raw logits over the whole vocabulary
    lse_eval     (n,) float32                log-sum-exp of logits / eval_temperature (exact p at that temperature)
    temperature  float                       the sampling temperature of the continuation
so p(x) = exp(logit_x - lse) exactly for every stored x, and the mass outside the top k is
1 - sum_x p(x).
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Iterable, Sequence
from pathlib import Path

import torch

from verispec.bench.datasets import Prompt, humaneval_prompts, spec_bench_prompts
from verispec.errors import ConfigError

HELDOUT_HUMANEVAL = 40
SPEC_BENCH_HOLDOUT_MOD = 5
DEFAULT_SPEC_BENCH = Path(__file__).resolve().parents[3] / ".." / "shared" / "data" / "spec_bench" / "question.jsonl"


def default_spec_bench_path() -> Path | None:
    """The development copy of Spec-Bench next to the repository, if present."""
    path = DEFAULT_SPEC_BENCH.resolve()
    return path if path.is_file() else None


def is_heldout(prompt: Prompt) -> bool:
    if prompt.category == "humaneval":
        return int(prompt.prompt_id.split("/")[-1]) < HELDOUT_HUMANEVAL
    return int(prompt.prompt_id) % SPEC_BENCH_HOLDOUT_MOD == 0


def split_prompts(split: str, spec_bench_path: str | Path | None = None, humaneval: bool = True) -> list[Prompt]:
    """Training ("train") or held-out ("heldout") prompts of HumanEval and Spec-Bench."""
    if split not in ("train", "heldout"):
        raise ConfigError(f"split must be 'train' or 'heldout', got {split!r}")
    prompts: list[Prompt] = list(humaneval_prompts()) if humaneval else []
    path = spec_bench_path or default_spec_bench_path()
    if path is not None:
        prompts += spec_bench_prompts(path)
    want_heldout = split == "heldout"
    return [p for p in prompts if is_heldout(p) == want_heldout]


def read_prompt_file(path: str | Path) -> list[Prompt]:
    """Prompts from a Spec-Bench-format JSONL file, or a plain text file with one prompt a line."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"prompt file {str(path)!r} not found")
    if path.suffix == ".jsonl":
        return spec_bench_prompts(path)
    lines = [line.strip() for line in path.read_text().splitlines() if line.strip()]
    if not lines:
        raise ConfigError(f"prompt file {str(path)!r} holds no prompt")
    return [Prompt(str(i), "file", json.loads(line) if line.startswith('"') else line) for i, line in enumerate(lines)]


def interleave(prompts: Sequence[Prompt], limit: int | None, seed: int = 0) -> list[Prompt]:
    """A deterministic shuffle (categories mixed), cut to ``limit``."""
    order = list(prompts)
    random.Random(seed).shuffle(order)
    return order if limit is None else order[:limit]


def encode_truncated(tokenizer, text: str, max_prompt_tokens: int) -> list[int]:
    """Chat-formatted prompt ids; the user text is cut to fit ``max_prompt_tokens`` in all."""
    from verispec.models.default import encode_prompt

    ids = encode_prompt(tokenizer, text)
    if len(ids) <= max_prompt_tokens:
        return ids
    text_ids = tokenizer.encode(text, add_special_tokens=False)
    keep = max(16, len(text_ids) - (len(ids) - max_prompt_tokens))
    return encode_prompt(tokenizer, tokenizer.decode(text_ids[:keep]))[:max_prompt_tokens]


def compress_logits(logits: torch.Tensor, top_k: int, eval_temperature: float) -> dict:
    """(n, V) raw logits -> top-k ids / fp16 logits, lse at temperature 1 and at eval_temperature."""
    logits = logits.float()
    values, ids = torch.topk(logits, min(top_k, logits.shape[-1]), dim=-1)
    lse = torch.logsumexp(logits, dim=-1)
    lse_eval = torch.logsumexp(logits / eval_temperature, dim=-1) if eval_temperature > 0 else lse
    return {
        "topk_ids": ids.to(torch.int32),
        "topk_logits": values.to(torch.float16),
        "lse": lse,
        "lse_eval": lse_eval,
    }


def special_ids(tokenizer) -> tuple[int, set[int]]:
    """(padding id, EOS ids) of a tokenizer, or (0, set()) for None (raw token-id models)."""
    if tokenizer is None:
        return 0, set()
    eos = tokenizer.eos_token_id
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (eos if eos is not None else 0)
    return int(pad), ({int(eos)} if eos is not None else set())


@torch.no_grad()
def generate_records(
    target,
    tokenizer,
    prompt_ids: Sequence[Sequence[int]],
    max_new_tokens: int,
    temperature: float,
    top_k: int = 64,
    eval_temperature: float = 0.6,
    seed: int = 0,
    keep_logits: bool = True,
) -> list[dict]:
    """Sample one continuation per prompt from the target in one batched, KV-cached ``generate``
    (left padding) and keep the target's logits at every generated position (the teacher).

    temperature 0 = greedy. A continuation ends after the first EOS token (included).
    tokenizer may be None (token-id models): padding id 0, no EOS. keep_logits False: tokens only
    (the caller recomputes the teacher with ``teacher_forced_records``).
    """
    pad, eos_ids = special_ids(tokenizer)
    width = max(len(p) for p in prompt_ids)
    batch = torch.full((len(prompt_ids), width), pad, dtype=torch.long)
    mask = torch.zeros_like(batch)
    for row, ids in enumerate(prompt_ids):
        batch[row, width - len(ids) :] = torch.tensor(list(ids))
        mask[row, width - len(ids) :] = 1
    device = next(target.parameters()).device
    torch.manual_seed(seed)
    sampling = {"do_sample": True, "temperature": temperature, "top_k": 0, "top_p": 1.0} if temperature > 0 else {"do_sample": False}
    out = target.generate(
        input_ids=batch.to(device),
        attention_mask=mask.to(device),
        max_new_tokens=max_new_tokens,
        min_new_tokens=1,
        pad_token_id=pad,
        eos_token_id=sorted(eos_ids) or None,
        output_logits=keep_logits,
        return_dict_in_generate=True,
        **sampling,
    )
    new_tokens = out.sequences[:, width:].cpu()
    step_logits = torch.stack([step.float().cpu() for step in out.logits], dim=1) if keep_logits else None  # (B, steps, V)
    records = []
    for row, ids in enumerate(prompt_ids):
        continuation = new_tokens[row].tolist()
        end = len(continuation)
        for index, token in enumerate(continuation):
            if token in eos_ids:
                end = index + 1
                break
        continuation = continuation[:end]
        record = compress_logits(step_logits[row, :end], top_k, eval_temperature) if keep_logits else {}
        record.update(
            tokens=torch.tensor(list(ids) + continuation, dtype=torch.int32),
            prompt_len=len(ids),
            target_start=len(ids),
            temperature=float(temperature),
        )
        records.append(record)
    return records


@torch.no_grad()
def teacher_forced_records(target, records: list[dict], top_k: int = 64, eval_temperature: float = 0.6, start: int = 1) -> list[dict]:
    """Recompute the teacher rows of ``records`` with one teacher-forced target forward per record,
    for every position from ``start`` (prompt tokens included): many more rows per generated
    token, at the cost of a batched forward (far cheaper per token than decoding)."""
    device = next(target.parameters()).device
    out = []
    for record in records:
        tokens = record["tokens"].long()
        first = max(1, min(start, int(record["prompt_len"])))
        logits = target(input_ids=tokens[None, :-1].to(device), logits_to_keep=len(tokens) - first).logits[0]
        updated = {k: v for k, v in record.items() if k not in ("topk_ids", "topk_logits", "lse", "lse_eval")}
        updated.update(compress_logits(logits, top_k, eval_temperature), target_start=first)
        out.append(updated)
    return out


def save_shard(path: str | Path, records: list[dict], meta: dict | None = None) -> None:
    """Write records atomically (a reader never sees half a shard)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = path.with_suffix(".tmp")
    torch.save({"records": records, "meta": meta or {}}, staging)
    staging.replace(path)


def load_shards(directory: str | Path, pattern: str = "shard-*.pt") -> list[dict]:
    """All records of the shards in ``directory`` (sorted by name)."""
    records: list[dict] = []
    for path in sorted(Path(directory).glob(pattern)):
        records += torch.load(path, weights_only=False)["records"]
    return records


def count_positions(records: Iterable[dict]) -> int:
    return sum(int(r["topk_ids"].shape[0]) for r in records)


def build_dataset(
    target,
    tokenizer,
    prompts: Sequence[Prompt] | Sequence[Sequence[int]],
    out_dir: str | Path,
    *,
    prefix: str = "shard",
    max_new_tokens: int = 128,
    max_prompt_tokens: int = 384,
    batch_size: int = 8,
    temperatures: Sequence[float] = (0.6, 0.8, 1.0),
    top_k: int = 64,
    eval_temperature: float = 0.6,
    passes: int = 1,
    seed: int = 0,
    progress: bool = True,
    all_positions: bool = False,
) -> int:
    """Generate target continuations for ``prompts`` (``Prompt``s, or token-id lists for models
    without a tokenizer) ``passes`` times, new seeds each pass, in
    batches of similar prompt length and write one shard per batch to out_dir. Existing shards
    are kept (a rerun resumes). all_positions: teacher rows for prompt positions too (one extra
    teacher-forced forward per sequence); else for the continuation only. Returns the number of
    positions written."""
    from tqdm import tqdm

    out_dir = Path(out_dir)
    encoded = [
        list(p) if not isinstance(p, Prompt) else encode_truncated(tokenizer, p.text, max_prompt_tokens) for p in prompts
    ]
    order = sorted(range(len(prompts)), key=lambda i: len(encoded[i]))
    batches = [order[i : i + batch_size] for i in range(0, len(order), batch_size)]
    random.Random(seed).shuffle(batches)  # every category early on, if the run is cut short
    written = 0
    jobs = [(pass_index, b) for pass_index in range(passes) for b in range(len(batches))]
    bar = tqdm(jobs, desc=f"target continuations ({prefix})", disable=not progress)
    for pass_index, batch_index in bar:
        path = out_dir / f"{prefix}-p{pass_index:02d}-b{batch_index:04d}.pt"
        if path.is_file():
            continue
        members = batches[batch_index]
        rng = random.Random(seed * 1_000_003 + pass_index * 10_007 + batch_index)
        temperature = rng.choice(list(temperatures))
        records = generate_records(
            target, tokenizer, [encoded[i] for i in members], max_new_tokens, temperature,
            top_k=top_k, eval_temperature=eval_temperature, seed=rng.randrange(2**31), keep_logits=not all_positions,
        )
        if all_positions:
            records = teacher_forced_records(target, records, top_k, eval_temperature)
        for i, record in zip(members, records):
            prompt = prompts[i]
            record["prompt_id"] = f"{prompt.category}:{prompt.prompt_id}" if isinstance(prompt, Prompt) else str(i)
        save_shard(path, records, {"temperature": temperature, "pass": pass_index})
        written += count_positions(records)
        bar.set_postfix(positions=written, T=temperature)
    return written


def token_frequencies(records: Iterable[dict], vocab_size: int, include_topk: bool = True) -> torch.Tensor:
    """Target probability mass per token over the stored positions (top-k mass when include_topk,
    plus one count per actual token), shape (V,) float64: ranks tokens for a sub-vocabulary."""
    mass = torch.zeros(vocab_size, dtype=torch.float64)
    for r in records:
        if include_topk:
            probs = torch.exp(r["topk_logits"].float() - r["lse"][:, None]).double()
            mass.index_add_(0, r["topk_ids"].reshape(-1).long(), probs.reshape(-1))
        tokens = r["tokens"][r["prompt_len"] :].long()
        mass.index_add_(0, tokens, torch.ones(len(tokens), dtype=torch.float64))
        # prompt tokens also get a small count: the draft reads them and copies some of them
        prompt = r["tokens"][: r["prompt_len"]].long()
        mass.index_add_(0, prompt, torch.full((len(prompt),), 0.1, dtype=torch.float64))
    return mass


def sub_vocabulary(records: Iterable[dict], vocab_size: int, size: int, always: Sequence[int] = ()) -> torch.Tensor:
    """The ``size`` tokens with the most target mass in ``records`` (plus ``always``), sorted ids.

    Tokens never seen in the records rank by id: BPE ids follow merge order, which roughly
    follows frequency in the tokenizer's corpus, so the rest of the set is still sensible."""
    mass = token_frequencies(records, vocab_size)
    mass += 1e-3 * (1.0 - torch.arange(vocab_size, dtype=torch.float64) / vocab_size)
    if always:
        mass[torch.tensor(list(always), dtype=torch.long)] = math.inf
    ids = torch.topk(mass, min(size, vocab_size)).indices
    return torch.sort(ids).values
