"""Anchor comparison: the same target/draft pair through transformers' own generation.

Two configurations of ``transformers`` ``model.generate`` run on the sweep's prompts, in the same
process and run as verispec's decoders:

- ``hf-generate``: plain ``generate`` without a draft (sampling, or greedy at temperature 0).
- ``hf-assisted``: assisted generation, ``generate(assistant_model=draft, ...)``, made a
  fixed-length L draft: on the assistant's ``generation_config`` (where transformers'
  ``AssistedCandidateGenerator`` reads them) we set ``num_assistant_tokens = L``,
  ``num_assistant_tokens_schedule = "constant"`` (no heuristic growing/shrinking of L) and
  ``assistant_confidence_threshold = 0`` (no early stop of the draft on low confidence; the
  transformers default is 0.4), restoring the previous values afterwards. With ``do_sample``
  transformers verifies with token-wise speculative sampling (Leviathan et al.), i.e. the
  counterpart of verispec's ``sd``; greedy decoding keeps the longest prefix matching the
  target's argmax.

Sampling parameters are passed explicitly (``temperature``, ``top_k`` = 0 disables it —
transformers' default would be 50 —, ``top_p``), and EOS is the same set verispec stops at
(an empty list disables stopping). Block efficiency of transformers' runs = new tokens / target
forward calls, counted with a forward hook on the target model. transformers has no separate
prefill call (the first forward scores the prompt and the first block together), so its calls
are the decoding rounds, as verispec's are (verispec prefills separately and does not count it).
Walltime is the whole ``generate`` call, prefill included, as for verispec.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Sequence

import torch

from verispec.bench.metrics import ALL_CATEGORIES, BASELINE, PromptRecord, SummaryRow

HF_PLAIN = "hf-generate"
HF_ASSISTED = "hf-assisted"
ANCHOR_METHODS = (HF_PLAIN, HF_ASSISTED)

# transformers settings that make assisted generation a fixed-length L draft (module docstring).
FIXED_DRAFT_SETTINGS = {"num_assistant_tokens_schedule": "constant", "assistant_confidence_threshold": 0.0}


@contextlib.contextmanager
def fixed_length_assistant(draft_model, draft_len: int):
    """Set the assistant's generation_config for a fixed-length ``draft_len`` draft, then restore."""
    config = draft_model.generation_config
    settings = {"num_assistant_tokens": int(draft_len), **FIXED_DRAFT_SETTINGS}
    previous = {key: getattr(config, key, None) for key in settings}
    for key, value in settings.items():
        setattr(config, key, value)
    try:
        yield
    finally:
        for key, value in previous.items():
            setattr(config, key, value)


@contextlib.contextmanager
def count_forward_calls(model):
    """Yields a one-element list holding the number of ``model`` forward calls so far."""
    calls = [0]
    handle = model.register_forward_hook(lambda module, args, output: calls.__setitem__(0, calls[0] + 1))
    try:
        yield calls
    finally:
        handle.remove()


@contextlib.contextmanager
def _quiet_transformers():
    from transformers.utils import logging

    previous = logging.get_verbosity()
    logging.set_verbosity_error()
    try:
        yield
    finally:
        logging.set_verbosity(previous)


@torch.no_grad()
def hf_generate(
    target_model,
    prompt_ids: Sequence[int],
    *,
    draft_model=None,
    draft_len: int = 4,
    temperature: float = 0.0,
    top_k: int = 0,
    top_p: float = 1.0,
    max_new_tokens: int = 128,
    eos_ids: Sequence[int] = (),
    seed: int = 0,
) -> tuple[list[int], float, int]:
    """(new token ids, seconds, target forward calls) of one transformers ``generate`` call,
    assisted by ``draft_model`` when given (fixed-length ``draft_len`` drafts)."""
    device = next(target_model.parameters()).device
    input_ids = torch.tensor([list(prompt_ids)], device=device)
    sample = temperature > 0
    kwargs = dict(
        max_new_tokens=int(max_new_tokens),
        do_sample=sample,
        eos_token_id=list(eos_ids),
        pad_token_id=int(next(iter(eos_ids), 0)),
        attention_mask=torch.ones_like(input_ids),
    )
    if sample:
        kwargs.update(temperature=float(temperature), top_k=int(top_k), top_p=float(top_p))
    else:
        kwargs.update(temperature=None, top_k=None, top_p=None)
    assistant = fixed_length_assistant(draft_model, draft_len) if draft_model is not None else contextlib.nullcontext()
    torch.manual_seed(seed)
    with assistant, count_forward_calls(target_model) as calls, _quiet_transformers():
        start = time.perf_counter()
        output = target_model.generate(input_ids, assistant_model=draft_model, **kwargs)
        seconds = time.perf_counter() - start
    return output[0, input_ids.shape[1]:].tolist(), seconds, calls[0]


def anchor_record(
    method: str, target_model, prompt_ids, *, dataset: str, category: str, prompt_id: str,
    temperature: float, seed: int, rng_seed: int | None = None, draft_model=None, draft_len: int = 0,
    top_k: int = 0, top_p: float = 1.0, max_new_tokens: int = 128, eos_ids: Sequence[int] = (), tokenizer=None,
) -> PromptRecord:
    """One transformers run as a PromptRecord (rounds and time breakdown unknown: left empty/NaN).
    ``seed`` is the sweep seed stored in the record; torch is seeded with ``rng_seed`` (default seed)."""
    tokens, seconds, calls = hf_generate(
        target_model, prompt_ids, draft_model=draft_model if method == HF_ASSISTED else None,
        draft_len=draft_len, temperature=temperature, top_k=top_k, top_p=top_p,
        max_new_tokens=max_new_tokens, eos_ids=eos_ids, seed=seed if rng_seed is None else rng_seed,
    )
    text = tokenizer.decode(tokens, skip_special_tokens=True) if tokenizer is not None else ""
    return PromptRecord(
        dataset=dataset, category=category, prompt_id=str(prompt_id), method=method,
        K=1 if method == HF_ASSISTED else 0, L=draft_len if method == HF_ASSISTED else 0,
        temperature=float(temperature), seed=int(seed), prompt_tokens=len(prompt_ids),
        new_tokens=len(tokens), target_calls=calls, seconds=seconds,
        stop_reason="eos" if tokens and tokens[-1] in set(eos_ids) else "max_new_tokens", text=text,
    )


def block_efficiency_interval(records: Sequence[PromptRecord], z: float = 1.96) -> tuple[float, float]:
    """Pooled block efficiency sum(new tokens) / sum(target calls) of ``records`` and the half-width
    of its normal-approximation confidence interval (z = 1.96: 95 %), by the delta method for a
    ratio of sums over independent records: se = sqrt(sum (n_i - R c_i)^2 / (m (m - 1))) / mean(c).
    Half-width NaN with fewer than two records."""
    tokens = sum(r.new_tokens for r in records)
    calls = sum(r.target_calls for r in records)
    if not calls:
        return math.nan, math.nan
    ratio = tokens / calls
    count = len(records)
    if count < 2:
        return ratio, math.nan
    squares = sum((r.new_tokens - ratio * r.target_calls) ** 2 for r in records)
    return ratio, z * math.sqrt(squares / (count * (count - 1))) / (calls / count)


def anchor_table(rows: Sequence[SummaryRow], records: Sequence[PromptRecord] = ()) -> list[dict]:
    """Side by side per dataset x temperature x L (category 'all'): transformers plain and
    assisted generation, verispec 'ar' and 'sd' (K = 1, same L); ratio = verispec sd tokens/s /
    transformers assisted tokens/s, measured in the same run. With ``records``, the 95 % interval
    half-widths of both block efficiencies (``block_efficiency_interval``) are added."""
    index = {(r.dataset, r.category, r.method, r.K, r.L, r.temperature): r for r in rows}
    table = []
    for row in rows:
        if row.method != HF_ASSISTED or row.category != ALL_CATEGORIES:
            continue
        key = (row.dataset, row.category)
        plain = index.get((*key, HF_PLAIN, 0, 0, row.temperature))
        ar = index.get((*key, BASELINE, 0, 0, row.temperature))
        sd = index.get((*key, "sd", 1, row.L, row.temperature))
        entry = {
            "dataset": row.dataset,
            "temperature": row.temperature,
            "L": row.L,
            "hf_generate_tps": plain.tokens_per_second if plain else math.nan,
            "hf_assisted_tps": row.tokens_per_second,
            "hf_assisted_be": row.block_efficiency,
            "verispec_ar_tps": ar.tokens_per_second if ar else math.nan,
            "verispec_sd_tps": sd.tokens_per_second if sd else math.nan,
            "verispec_sd_be": sd.block_efficiency if sd else math.nan,
            "sd_over_hf_assisted": (sd.tokens_per_second / row.tokens_per_second) if sd and row.tokens_per_second else math.nan,
            "hf_assisted_speedup_vs_hf_generate": (row.tokens_per_second / plain.tokens_per_second) if plain and plain.tokens_per_second else math.nan,
        }
        if records:
            for method, name in ((HF_ASSISTED, "hf_assisted"), ("sd", "verispec_sd")):
                chosen = [r for r in records if r.dataset == row.dataset and r.method == method and r.L == row.L
                          and r.temperature == row.temperature and (method == HF_ASSISTED or r.K == 1)]
                entry[f"{name}_be_ci"] = block_efficiency_interval(chosen)[1]
        table.append(entry)
    return table


ANCHOR_COLUMNS = [
    ("dataset", "dataset"), ("temperature", "T"), ("L", "L"),
    ("hf_generate_tps", "hf generate tok/s"), ("hf_assisted_tps", "hf assisted tok/s"),
    ("hf_assisted_be", "hf assisted BE"), ("verispec_ar_tps", "verispec ar tok/s"),
    ("verispec_sd_tps", "verispec sd tok/s"), ("verispec_sd_be", "verispec sd BE"),
    ("sd_over_hf_assisted", "sd / hf assisted tok/s"),
]
