"""SPRINTER's cost in distribution and its speed (ALGORITHMS.md §11 "Guarantees", §14.5 item 8).

Exact next-token law of SPRINTER at one context, for any verifier whose acceptance a(x) may
depend on the drafted token x (token features) — derived from the inference procedure of §11:

    P_S(x) = q(x) a(x) + (1 - a(x)) min(p(x), q(x)) + R [p(x) - q(x)]_+ / TV(p, q),
    R      = sum_y (1 - a(y)) [q(y) - p(y)]_+             (mass sent to the residual)

(first term: kept by the verifier; second: verifier-rejected and kept by the target test; third:
rejected by both and resampled from norm([p - q]_+)). With A = {q <= p} it follows that
TV(P_S, p) = beta_w TV(p, q) EXACTLY, where beta_w = sum_{x not in A} a(x) [q(x) - p(x)]_+ / TV is
the (q - p)-weighted false-positive rate; for an idealised verifier (a = alpha on A, beta off A)
P_S = (1 - beta) p + beta q (Thm 3.1). A context-only verifier (a(x) = s for all x) gives
(1 - s) p + s q.

``toy_distribution_check`` verifies Thm 3.1, Thm A.4 and Thm 3.3 by exact enumeration of the
production rule (``verify.sprinter``) on toy models; ``real_pair_tv`` evaluates P_S exactly at
sampled contexts of a real pair; ``evaluate_against_sd`` measures speed and ROUGE against SD.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from verispec.core.rng import enumerate_outcomes
from verispec.core.tree import DraftTree
from verispec.theory.closed_forms import (
    sprinter_expected_run_length,
    sprinter_kept_probability,
    sprinter_run_length_pmf,
    sprinter_token_law,
    total_variation_distance,
)
from verispec.verify.sprinter import IdealizedSprinter


# ----- exact laws ------------------------------------------------------------------------------
def sprinter_next_token_law(target: np.ndarray, draft: np.ndarray, accept: np.ndarray) -> np.ndarray:
    """Exact law of SPRINTER's next token at one context (module docstring). target, draft:
    (V,) p and q; accept: (V,) probability that the verifier accepts token x without the target
    (0/1 for a thresholded score; only entries with q(x) > 0 matter). Returns (V,) float64."""
    p = np.asarray(target, dtype=np.float64)
    q = np.asarray(draft, dtype=np.float64)
    a = np.clip(np.asarray(accept, dtype=np.float64), 0.0, 1.0)
    excess = np.maximum(q - p, 0.0)
    deficit = np.maximum(p - q, 0.0)
    tv = deficit.sum()
    routed = float(((1.0 - a) * excess).sum())
    law = q * a + (1.0 - a) * np.minimum(p, q)
    if tv > 0:
        law = law + routed * deficit / tv
    return law


def weighted_false_positive_rate(target: np.ndarray, draft: np.ndarray, accept: np.ndarray) -> float:
    """beta_w = sum_{q > p} a(x) (q(x) - p(x)) / TV(p, q): TV(P_S, p) = beta_w TV(p, q) exactly."""
    excess = np.maximum(np.asarray(draft, dtype=np.float64) - np.asarray(target, dtype=np.float64), 0.0)
    tv = excess.sum()
    return float((np.asarray(accept, dtype=np.float64) * excess).sum() / tv) if tv > 0 else 0.0


def first_token_law(block_law_probs: dict) -> dict[int, float]:
    out: dict[int, float] = {}
    for output, prob in block_law_probs.items():
        out[output[0]] = out.get(output[0], 0.0) + prob
    return out


def run_length_law(tpr: float, fpr: float, num_acceptable: int, extra: int = 80) -> dict[int, float]:
    """Exact law of N (verifier-accepted tokens before the first verifier rejection) by
    enumerating the production ``IdealizedSprinter`` on a context-free V = 2 chain whose first
    ``num_acceptable`` tokens are acceptable (q <= p) and the next ``extra`` are not. The cap of
    the chain is reached with probability alpha^n beta^extra (reported under key -1)."""
    target, draft = np.array([0.7, 0.3]), np.array([0.3, 0.7])  # token 0 acceptable, token 1 not
    length = num_acceptable + extra
    tokens = [0] * num_acceptable + [1] * extra
    tree = DraftTree.chain(tokens, np.tile(target, (length + 1, 1)), np.tile(draft, (length, 1)))
    verifier = IdealizedSprinter(tpr, fpr)

    def program(rng):
        result = verifier.verify(tree, rng)
        return -1 if result.is_bonus else result.accepted_len

    return enumerate_outcomes(program)


def toy_distribution_check(tpr: float = 0.8, fpr: float = 0.3, vocab_size: int = 4, seed: int = 0, num_acceptable: int = 5) -> dict:
    """§14.5 item 8 on toy models, by exact enumeration of the production rule:
    the token law equals (1 - beta) p + beta q and TV = beta TV(p, q) (Thm 3.1), the kept
    probability is 1 - (1 - beta) TV (Thm A.4), and the run-length law and E[N] match Thm 3.3
    (fpr = 1 makes E[N] infinite). Returns the worst absolute errors (~1e-16 when the theory holds)."""
    from verispec.draft.samplers import sample_chain
    from verispec.models.toy import ToyDraft, ToyModel
    from verispec.theory.enumerate import LayeredProcess, run_step

    target = ToyModel(vocab_size, seed=seed, zero_frac=0.25)
    draft = ToyDraft(target, seed=seed + 1000, zero_frac=0.25)
    p, q = target(()), draft(())
    verifier = IdealizedSprinter(tpr, fpr)
    process = LayeredProcess(target, draft)

    def program(rng):  # one round (L = 1 chain): first emitted token, and was the drafted token kept?
        result = run_step(verifier, lambda r, fn: sample_chain(r, fn, 1), process, (), rng)
        kept = result.is_bonus or bool(result.diagnostics.get("kept_draft_token", False))
        return result.output_tokens[0], kept

    law = enumerate_outcomes(program)
    measured = np.zeros(vocab_size)
    kept = 0.0
    for (token, was_kept), prob in law.items():
        measured[token] += prob
        kept += prob if was_kept else 0.0
    predicted = sprinter_token_law(p, q, fpr)

    runs = run_length_law(tpr, fpr, num_acceptable)
    pmf_error = max(abs(prob - sprinter_run_length_pmf(tpr, fpr, num_acceptable, k)) for k, prob in runs.items() if k >= 0)
    mean_run = sum(k * prob for k, prob in runs.items() if k >= 0)
    return {
        "tpr": tpr,
        "fpr": fpr,
        "vocab_size": vocab_size,
        "token_law_max_abs_error": float(np.abs(measured - predicted).max()),
        "tv_measured": total_variation_distance(measured, p),
        "tv_theory": fpr * total_variation_distance(p, q),
        "tv_abs_error": abs(total_variation_distance(measured, p) - fpr * total_variation_distance(p, q)),
        "kept_probability": kept,
        "kept_probability_abs_error": abs(kept - sprinter_kept_probability(p, q, fpr)),
        "num_acceptable": num_acceptable,
        "run_length_pmf_max_abs_error": pmf_error,
        "expected_run_length_enumerated": mean_run,
        "expected_run_length_formula": sprinter_expected_run_length(tpr, fpr, num_acceptable) if fpr < 1 else float("inf"),
        "cap_probability": runs.get(-1, 0.0),
        "law_mass": float(sum(law.values())),
    }


# ----- the real pair ---------------------------------------------------------------------------
def support_tokens(draft: np.ndarray, mass: float = 1.0) -> np.ndarray:
    """Tokens with q > 0 (mass = 1), or the most probable ones covering ``mass`` of q (a neural
    draft at temperature > 0 puts mass on the whole vocabulary)."""
    q = np.asarray(draft)
    if mass >= 1.0:
        return np.flatnonzero(q > 0)
    order = np.argsort(-q, kind="stable")
    cut = int(np.searchsorted(np.cumsum(q[order]), mass)) + 1
    return np.sort(order[:cut])


def real_pair_tv(
    target_adapter,
    draft_oracle,
    verifier,
    prompts: Sequence[Sequence[int]],
    continuations: Sequence[Sequence[int]],
    params,
    fpr_theory: float | None,
    positions_per_prompt: int = 16,
    support_mass: float = 1.0,
    seed: int = 0,
) -> dict:
    """Exact TV(P_S, p) at sampled contexts prompt + continuation[:j] of a real pair.

    verifier: a ``decoder.FeatureVerifier`` (deterministic decisions s >= eta). The law P_S is
    computed over the whole vocabulary from p, q and the verifier's decisions on q's support
    (``sprinter_next_token_law``); no sampling. Next to it: TV(p, q), the theory value
    fpr_theory * TV(p, q) (Thm 3.1 with the held-out FPR at gamma = 1) and the exact identity
    beta_w * TV(p, q)."""
    from verispec.core.sampling import logits_to_probs
    from verispec.sprinter.features import DraftState

    chooser = np.random.default_rng(seed)
    records = []
    for prompt, continuation in zip(prompts, continuations):
        prompt, continuation = [int(t) for t in prompt], [int(t) for t in continuation]
        if not continuation:
            continue
        target_adapter.reset(prompt)
        logits = target_adapter.score([-1, *continuation[:-1]], list(range(-1, len(continuation) - 1)))
        target_rows = logits_to_probs(logits, params)
        draft_rows, hidden = draft_oracle.rows(prompt, continuation[:-1])
        count = min(positions_per_prompt, len(continuation))
        for j in sorted(chooser.choice(len(continuation), size=count, replace=False).tolist()):
            p, q = target_rows[j], draft_rows[j]
            tokens = support_tokens(q, support_mass)
            state = DraftState(np.asarray(prompt + continuation[:j], dtype=np.int64), q, None if hidden is None else hidden[j])
            accept = np.zeros(len(q))
            accept[tokens] = (verifier.scores(state, tokens) >= verifier.eta).astype(np.float64)
            law = sprinter_next_token_law(p, q, accept)
            tv_pq = total_variation_distance(p, q)
            records.append(
                {
                    "tv_sprinter": total_variation_distance(law, p),
                    "tv_pq": tv_pq,
                    "beta_weighted": weighted_false_positive_rate(p, q, accept),
                    "accept_mass": float((q * accept).sum()),
                    "theory": None if fpr_theory is None else fpr_theory * tv_pq,
                }
            )
    tv_s = np.array([r["tv_sprinter"] for r in records])
    tv_pq = np.array([r["tv_pq"] for r in records])
    identity = np.array([r["beta_weighted"] * r["tv_pq"] for r in records])
    return {
        "contexts": len(records),
        "mean_tv_sprinter_vs_target": float(tv_s.mean()) if len(tv_s) else float("nan"),
        "median_tv_sprinter_vs_target": float(np.median(tv_s)) if len(tv_s) else float("nan"),
        "mean_tv_draft_vs_target": float(tv_pq.mean()) if len(tv_pq) else float("nan"),
        "fpr_theory": fpr_theory,
        "mean_theory_fpr_times_tv": None if fpr_theory is None else float(fpr_theory * tv_pq.mean()),
        "mean_weighted_fpr": float(np.mean([r["beta_weighted"] for r in records])) if records else float("nan"),
        "identity_max_abs_error": float(np.abs(tv_s - identity).max()) if len(tv_s) else float("nan"),
        "mean_verifier_accept_mass": float(np.mean([r["accept_mass"] for r in records])) if records else float("nan"),
        "note": "TV(P_S, p) exact per context; theory = held-out FPR(gamma=1) x TV(p, q) (Thm 3.1); identity: TV(P_S, p) = beta_w TV(p, q)",
    }


# ----- speed and quality against SD ------------------------------------------------------------
ROUGE_TYPES = ("rouge1", "rouge2", "rougeL")


def rouge_f(candidates: Sequence[str], references: Sequence[str]) -> dict[str, float]:
    """Mean ROUGE-1/2/L F-measure (``rouge-score``, Porter stemming) over aligned pairs."""
    from rouge_score.rouge_scorer import RougeScorer

    scorer = RougeScorer(list(ROUGE_TYPES), use_stemmer=True)
    totals = {kind: [] for kind in ROUGE_TYPES}
    for candidate, reference in zip(candidates, references):
        scores = scorer.score(reference, candidate)
        for kind in ROUGE_TYPES:
            totals[kind].append(scores[kind].fmeasure)
    return {kind: float(np.mean(values)) if values else float("nan") for kind, values in totals.items()}


@dataclass
class EvalPrompt:
    prompt_id: str
    ids: list[int]
    reference: str | None = None


def _decode_seconds(output) -> float:
    return max(output.seconds - output.prefill_seconds, 1e-9)


def evaluate_against_sd(sprinter_decoder, sd_decoder, prompts: Sequence[EvalPrompt], ar_decoder=None, seeds=(0,), log=print) -> dict:
    """Run SD and SPRINTER (and plain sampling when ``ar_decoder`` is given) on the same prompts
    and seeds, back to back per prompt so machine load hits both alike.

    speedup_vs_sd = (SD decoding seconds per token) / (SPRINTER decoding seconds per token),
    decoding = walltime minus the (identical) target prefill; the ratio with prefill included is
    reported too. ROUGE: SPRINTER and SD against the dataset references where they exist, and
    SPRINTER against SD's output on the same prompt and seed."""
    rows = []
    for prompt in prompts:
        for seed in seeds:
            row = {"prompt_id": prompt.prompt_id, "seed": seed, "prompt_tokens": len(prompt.ids), "reference": prompt.reference}
            decoders = [("sd", sd_decoder), ("sprinter", sprinter_decoder)] + ([("ar", ar_decoder)] if ar_decoder is not None else [])
            for name, decoder in decoders:
                decoder.seed = seed
                output = decoder.generate(prompt.ids)
                row[name] = {
                    "text": output.text,
                    "token_ids": list(output.token_ids),
                    "new_tokens": output.new_tokens,
                    "target_calls": output.target_calls,
                    "tokens_per_target_call": output.block_efficiency,
                    "seconds": output.seconds,
                    "prefill_seconds": output.prefill_seconds,
                    "decode_seconds": _decode_seconds(output),
                    "time_breakdown": output.time_breakdown(),
                }
                if name == "sprinter":
                    row[name]["flops"] = output.flops
                    row[name]["verifier"] = output.verifier_summary()
            log(
                f"prompt {prompt.prompt_id} seed {seed}: SD {row['sd']['new_tokens']} tok / {row['sd']['target_calls']} calls "
                f"{row['sd']['decode_seconds']:.2f} s | SPRINTER {row['sprinter']['new_tokens']} tok / "
                f"{row['sprinter']['target_calls']} calls {row['sprinter']['decode_seconds']:.2f} s"
            )
            rows.append(row)

    def totals(name, key):
        return sum(r[name][key] for r in rows)

    def per_token(name, key):
        return totals(name, key) / max(totals(name, "new_tokens"), 1)

    sprinter_texts = [r["sprinter"]["text"] for r in rows]
    sd_texts = [r["sd"]["text"] for r in rows]
    with_ref = [r for r in rows if r["reference"]]
    rouge_ref_sprinter = rouge_f([r["sprinter"]["text"] for r in with_ref], [r["reference"] for r in with_ref]) if with_ref else None
    rouge_ref_sd = rouge_f([r["sd"]["text"] for r in with_ref], [r["reference"] for r in with_ref]) if with_ref else None
    rouge_vs_sd = rouge_f(sprinter_texts, sd_texts)
    headline = rouge_ref_sprinter or rouge_vs_sd
    result = {
        "speedup_vs_sd": per_token("sd", "decode_seconds") / per_token("sprinter", "decode_seconds"),
        "speedup_vs_sd_with_prefill": per_token("sd", "seconds") / per_token("sprinter", "seconds"),
        "tokens_per_target_call": totals("sprinter", "new_tokens") / max(totals("sprinter", "target_calls"), 1),
        "sd_tokens_per_target_call": totals("sd", "new_tokens") / max(totals("sd", "target_calls"), 1),
        "target_calls": {"sprinter": totals("sprinter", "target_calls"), "sd": totals("sd", "target_calls")},
        "new_tokens": {"sprinter": totals("sprinter", "new_tokens"), "sd": totals("sd", "new_tokens")},
        "decode_seconds_per_token": {"sprinter": per_token("sprinter", "decode_seconds"), "sd": per_token("sd", "decode_seconds")},
        **{kind: headline[kind] for kind in ROUGE_TYPES},
        "rouge_headline": "SPRINTER vs dataset references" if rouge_ref_sprinter else "SPRINTER vs SD output (no references in this dataset)",
        "rouge_vs_reference": None if not with_ref else {"sprinter": rouge_ref_sprinter, "sd": rouge_ref_sd, "prompts": len(with_ref)},
        "rouge_sprinter_vs_sd": rouge_vs_sd,
        "verifier_accept_rate": float(np.mean([r["sprinter"]["verifier"]["verifier_accept_rate"] for r in rows])),
        "flops_sprinter": {
            part: float(sum(r["sprinter"]["flops"][part] or 0.0 for r in rows)) for part in ("target", "verifier")
        },
        "prompts": len(prompts),
        "seeds": list(seeds),
        "rows": rows,
    }
    if ar_decoder is not None:
        result["speedup_vs_ar"] = per_token("ar", "decode_seconds") / per_token("sprinter", "decode_seconds")
        result["sd_speedup_vs_ar"] = per_token("ar", "decode_seconds") / per_token("sd", "decode_seconds")
        # noise floor of "SPRINTER vs SD": two exact target samples (plain sampling vs SD) agree this much
        result["rouge_ar_vs_sd"] = rouge_f([r["ar"]["text"] for r in rows], sd_texts)
        if with_ref:
            result["rouge_vs_reference"]["ar"] = rouge_f([r["ar"]["text"] for r in with_ref], [r["reference"] for r in with_ref])
    return result


def timestamp() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S")
