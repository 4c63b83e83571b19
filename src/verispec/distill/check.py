"""``verispec draft check`` / ``draft temperature``: is a draft worth using with a target?

* vocabulary compatibility: same vocabulary size and the same token strings;
* cost ratio c = draft ms per token / target ms per token, both timed here as single-token KV-cached
  decode steps (forward + probability processing, median over interleaved steps at a fixed
  context), the n-gram draft as its ``probs`` call;
* token-level acceptance alpha = mean over real positions of sum_x min(p(x), q(x)), with p, q the
  target's and the draft's next-token distributions after the same sampling parameters (the
  draft may have its own temperature). Real positions: both models teacher-forced on the target's
  own continuations of the prompts (sampled at the checked temperature), every continuation
  position counted;
* predicted block efficiency (1 - a^(L+1)) / (1 - a) and speedup BE / (1 + L c) for L = 1..16
  (theory.closed_forms, constant-acceptance model), the best L, and a verdict.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

import numpy as np
import torch

from verispec.core.sampling import SamplingParams, logits_to_probs, process_probs
from verispec.errors import ConfigError
from verispec.theory.closed_forms import expected_block_efficiency, expected_speedup

MAX_L = 16
GOOD_COST_RATIO = 0.15
GOOD_ALPHA = 0.5


# --------------------------------------------------------------------------- vocabulary
def model_vocab_size(model) -> int:
    """The vocabulary the engine sees: output rows, or config.vocab_size (sub-vocabulary drafts)."""
    out = model.get_output_embeddings()
    return int(out.weight.shape[0]) if out is not None else int(model.config.vocab_size)


def check_vocabularies(target_vocab: int, draft_vocab: int, target_tokenizer=None, draft_tokenizer=None) -> list[str]:
    """Reasons the pair cannot share one vocabulary (empty list = compatible)."""
    problems = []
    if target_vocab != draft_vocab:
        problems.append(f"vocabulary sizes differ: target {target_vocab} tokens, draft {draft_vocab}")
    if target_tokenizer is not None and draft_tokenizer is not None:
        target_tokens, draft_tokens = target_tokenizer.get_vocab(), draft_tokenizer.get_vocab()
        if target_tokens != draft_tokens:
            differing = sorted(
                {t for t in set(target_tokens) ^ set(draft_tokens)}
                | {t for t in set(target_tokens) & set(draft_tokens) if target_tokens[t] != draft_tokens[t]}
            )
            problems.append(
                f"token strings differ: {len(differing)} tokens map to different ids or exist in one tokenizer only "
                f"(e.g. {differing[:3]})"
            )
    return problems


def require_compatible(problems: list[str]) -> None:
    if problems:
        raise ConfigError(
            "draft and target vocabularies are incompatible: " + "; ".join(problems) + ". Speculative decoding "
            "needs one shared tokenizer: use a draft trained with the target's tokenizer (same family and "
            "vocabulary), or train one with `verispec distill --target T`"
        )


# ------------------------------------------------------------------------------- alpha
def acceptance_per_position(target_probs: np.ndarray, draft_probs: np.ndarray) -> np.ndarray:
    """sum_x min(p(x), q(x)) for each row: (n, V), (n, V) -> (n,)."""
    return np.minimum(target_probs, draft_probs).sum(axis=-1)


@torch.no_grad()
def continuation_logits(model, tokens: Sequence[int], prompt_len: int) -> torch.Tensor:
    """Teacher-forced logits predicting tokens[prompt_len:], shape (len - prompt_len, V), float32 CPU."""
    device = next(model.parameters()).device
    ids = torch.tensor([list(tokens)[:-1]], device=device)
    logits = model(input_ids=ids, logits_to_keep=len(tokens) - prompt_len).logits[0]
    return logits.float().cpu()


@dataclass
class AlphaResult:
    alpha: float
    alpha_std_over_sequences: float
    positions: int
    per_sequence: list[float] = field(default_factory=list)


def _summarize(per_position: list[np.ndarray]) -> AlphaResult:
    values = np.concatenate(per_position) if per_position else np.zeros(0)
    per_sequence = [float(v.mean()) for v in per_position if len(v)]
    return AlphaResult(
        float(values.mean()) if len(values) else 0.0,
        float(np.std(per_sequence)) if per_sequence else 0.0,
        int(len(values)),
        per_sequence,
    )


def sequence_logits(model, sequences: Sequence[tuple[Sequence[int], int]]) -> list[torch.Tensor]:
    return [continuation_logits(model, tokens, prompt_len) for tokens, prompt_len in sequences]


def ngram_probs(vocab_size: int, tokens: Sequence[int], prompt_len: int, max_n: int = 3) -> np.ndarray:
    """The n-gram draft's raw q at every continuation position (running context), (n, V)."""
    from verispec.models.ngram import NGramDraft

    draft = NGramDraft(vocab_size, max_n=max_n)
    draft.reset(list(tokens)[:prompt_len])
    rows = []
    for token in list(tokens)[prompt_len:]:
        rows.append(draft.probs())
        draft.append([token])
    return np.stack(rows)


def alpha_from_logits(
    target_logits: list[torch.Tensor], draft_rows: list, params: SamplingParams, draft_params: SamplingParams, rows_are_probs: bool = False
) -> AlphaResult:
    """alpha from per-sequence target logits and draft logits (or raw draft probs for the n-gram)."""
    per_position = []
    for target_row, draft_row in zip(target_logits, draft_rows):
        p = logits_to_probs(target_row, params)
        q = process_probs(draft_row, draft_params) if rows_are_probs else logits_to_probs(draft_row, draft_params)
        per_position.append(acceptance_per_position(p, q))
    return _summarize(per_position)


# ---------------------------------------------------------------------------- sequences
def target_sequences(
    target, tokenizer, prompt_ids: Sequence[Sequence[int]], max_new_tokens: int, temperature: float, seed: int = 0, batch_size: int = 8
) -> list[tuple[list[int], int]]:
    """(prompt + target continuation, prompt length) per prompt: batched sampling from the target."""
    from verispec.distill.data import generate_records

    sequences = []
    for first in range(0, len(prompt_ids), batch_size):
        records = generate_records(
            target, tokenizer, prompt_ids[first : first + batch_size], max_new_tokens, temperature, top_k=1, seed=seed + first
        )
        sequences += [(r["tokens"].tolist(), int(r["prompt_len"])) for r in records]
    return sequences


# --------------------------------------------------------------------------------- cost
@torch.no_grad()
def decode_step_timer(model, params: SamplingParams, context: Sequence[int]):
    """A callable timing one KV-cached single-token decode step (forward + probabilities), in ms."""
    from verispec.models.hf import HFModelAdapter

    adapter = HFModelAdapter(model)
    adapter.reset(list(context))
    token = int(context[-1])

    def step() -> float:
        tic = time.perf_counter()
        logits = adapter.score([-1], [-1])
        logits_to_probs(logits, params)
        adapter.commit([], token)
        return 1e3 * (time.perf_counter() - tic)

    return step


def ngram_step_timer(vocab_size: int, params: SamplingParams, context: Sequence[int]):
    """A callable timing the n-gram draft's q for one position (probs + processing), in ms."""
    from verispec.models.ngram import NGramDraft

    draft = NGramDraft(vocab_size)
    draft.reset(list(context))

    def step() -> float:
        tic = time.perf_counter()
        process_probs(draft.probs()[None], params)
        draft.append([int(context[-1])])
        return 1e3 * (time.perf_counter() - tic)

    return step


def measure_cost_ratio(target_step, draft_step, steps: int = 30, warmup: int = 3) -> dict:
    """Median ms per token of each, timed in alternation (so both see the same machine load)."""
    for _ in range(warmup):
        target_step()
        draft_step()
    target_ms, draft_ms = [], []
    for _ in range(steps):
        target_ms.append(target_step())
        draft_ms.append(draft_step())
    target_median, draft_median = statistics.median(target_ms), statistics.median(draft_ms)
    return {
        "target_ms_per_token": target_median,
        "draft_ms_per_token": draft_median,
        "cost_ratio": draft_median / target_median,
        "steps": steps,
    }


def context_for_timing(sequences: Sequence[tuple[Sequence[int], int]], length: int = 200) -> list[int]:
    """About ``length`` real tokens (the longest sequence, cut or repeated)."""
    tokens = list(max(sequences, key=lambda s: len(s[0]))[0]) if sequences else [0]
    while len(tokens) < length:
        tokens = tokens + tokens
    return tokens[:length]


# ------------------------------------------------------------------------------ verdict
def predictions(alpha: float, cost_ratio: float, max_len: int = MAX_L) -> list[dict]:
    return [
        {
            "L": length,
            "block_efficiency": expected_block_efficiency(alpha, length),
            "speedup": expected_speedup(alpha, length, length * cost_ratio),
        }
        for length in range(1, max_len + 1)
    ]


def verdict(alpha: float, cost_ratio: float, best_speedup: float) -> tuple[str, list[str]]:
    """('good' | 'marginal' | 'not worth it', reasons) from the usual rules of thumb."""
    reasons = []
    if cost_ratio > GOOD_COST_RATIO:
        reasons.append(f"cost ratio c = {cost_ratio:.3f} is above ~{GOOD_COST_RATIO}: the draft is too slow relative to the target")
    else:
        reasons.append(f"cost ratio c = {cost_ratio:.3f} is below ~{GOOD_COST_RATIO}: cheap enough")
    if alpha < GOOD_ALPHA:
        reasons.append(f"acceptance alpha = {alpha:.3f} is below ~{GOOD_ALPHA}: most drafted tokens will be rejected")
    else:
        reasons.append(f"acceptance alpha = {alpha:.3f} is above ~{GOOD_ALPHA}")
    reasons.append(f"predicted best speedup {best_speedup:.2f}x (closed form, constant acceptance)")
    if best_speedup <= 1.0:
        return "not worth it", reasons + ["no draft length is predicted to beat plain decoding"]
    if cost_ratio <= GOOD_COST_RATIO and alpha >= GOOD_ALPHA:
        return "good", reasons
    return "marginal", reasons


@dataclass
class CheckReport:
    target: str
    draft: str
    vocab_compatible: bool
    vocab_problems: list[str]
    temperature: float
    draft_temperature: float
    alpha: float
    alpha_std_over_sequences: float
    positions: int
    sequences: int
    cost_ratio: float
    target_ms_per_token: float
    draft_ms_per_token: float
    best_L: int
    predicted_speedup: float
    predicted_block_efficiency: float
    verdict: str
    reasons: list[str]
    by_L: list[dict]
    dtype: str = "fp32"

    def to_dict(self) -> dict:
        return asdict(self)


def build_report(
    target_name: str, draft_name: str, problems: list[str], params: SamplingParams, draft_params: SamplingParams,
    alpha: AlphaResult, cost: dict, sequences: int, dtype: str,
) -> CheckReport:
    rows = predictions(alpha.alpha, cost["cost_ratio"])
    best = max(rows, key=lambda r: r["speedup"])
    label, reasons = verdict(alpha.alpha, cost["cost_ratio"], best["speedup"])
    return CheckReport(
        target=target_name, draft=draft_name, vocab_compatible=not problems, vocab_problems=problems,
        temperature=params.temperature, draft_temperature=draft_params.temperature,
        alpha=alpha.alpha, alpha_std_over_sequences=alpha.alpha_std_over_sequences, positions=alpha.positions,
        sequences=sequences, cost_ratio=cost["cost_ratio"], target_ms_per_token=cost["target_ms_per_token"],
        draft_ms_per_token=cost["draft_ms_per_token"], best_L=best["L"], predicted_speedup=best["speedup"],
        predicted_block_efficiency=best["block_efficiency"], verdict=label, reasons=reasons, by_L=rows, dtype=dtype,
    )


def sweep_draft_temperature(
    target_logits: list[torch.Tensor], draft_rows: list, params: SamplingParams, draft_temperatures: Sequence[float], rows_are_probs: bool = False
) -> list[dict]:
    """alpha for each draft temperature, the target's processing fixed."""
    results = []
    for temperature in draft_temperatures:
        draft_params = SamplingParams(temperature, params.top_k, params.top_p)
        result = alpha_from_logits(target_logits, draft_rows, params, draft_params, rows_are_probs)
        results.append({"draft_temperature": float(temperature), "alpha": result.alpha, "positions": result.positions})
    return results
