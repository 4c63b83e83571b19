"""``verispec draft check --draft head|DIR``: is an EAGLE-3 head worth using with its target?

* acceptance per depth, alpha_k = mean over positions of sum_x min(p(x), q_k(x)), p the target's
  next-token distribution and q_k the head's depth-k draft distribution (both after the sampling
  parameters; q = 0 outside the draft vocabulary), teacher-forced on the target's own continuations:
  ``Eagle3Head.unrolled`` (EAGLE-3's training-time test, proven equal to decode-time drafting) with
  the drafted prefix set to the target's own tokens, so alpha_k is the acceptance at depth k given
  that depths 1..k-1 were accepted. Features from ``models.eagle_head.target_features``.
* cost ratio c = one head draft step (embedding lookup, one midlayer pass over one new entry
  against a cached context, LM head, probabilities over V) / one KV-cached target decode step
  (``distill.check.decode_step_timer``), medians of steps timed in alternation on the same context.
* predicted tokens per round for a chain of L head steps, 1 + sum_{d<=L} prod_{i<=d} alpha_i, over
  the round cost 1 + L c, for L = 1..depths (no extrapolation beyond the measured depths); the best
  L and a verdict with ``distill.check.verdict``'s rules of thumb.
* token trees, children drawn i.i.d. from the head's q and verified top-down by RRS (ALGORITHMS.md
  §8, §13): per depth the acceptance with m children, alpha_d(m) = 1 - prod_{j<m} (1 - sum_x
  min(t_j, q)) (§8.1's closed form, t_0 = p, t_{j+1} = norm([t_j - q]_+)), for m in ``TREE_CHILDREN``;
  a shape (k_1..k_L) is predicted 1 + sum_d prod_{i<=d} alpha_i(k_i) tokens per round over
  1 + c * (head query rows: prod_{i<d} k_i at level d). Assumptions, stated: the accepted child is
  distributed as the target's token (so the next level's teacher-forced acceptance applies), a head
  query row costs one head step, and the target forward costs the same for the tree as for one token.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np
import torch

from verispec.core.sampling import SamplingParams, logits_to_probs
from verispec.distill.check import acceptance_per_position, measure_cost_ratio, verdict
from verispec.models.eagle_head import Eagle3Head, target_features


TREE_CHILDREN = (1, 2, 4)
TREE_SHAPES = ((2, 1), (2, 2), (4, 1), (2, 1, 1), (2, 2, 1), (4, 2, 1), (2, 1, 1, 1), (2, 2, 1, 1), (4, 2, 1, 1))


def rrs_acceptance(target_probs: np.ndarray, draft_probs: np.ndarray, children: int) -> np.ndarray:
    """Probability that top-down RRS accepts one of ``children`` i.i.d. draws from q at each row
    (ALGORITHMS.md §8.1, closed form): (n, V), (n, V) -> (n,)."""
    residual = target_probs
    reject = np.ones(target_probs.shape[0])
    for _ in range(children):
        accept = np.minimum(residual, draft_probs).sum(axis=-1)
        reject = reject * (1.0 - accept)
        left = np.maximum(residual - draft_probs, 0.0)
        mass = left.sum(axis=-1, keepdims=True)
        residual = np.divide(left, mass, out=np.zeros_like(left), where=mass > 0)
    return 1.0 - reject


@dataclass
class HeadAlpha:
    """alpha_per_depth[k-1] = alpha_k; std over sequences and position counts per depth;
    draft_vocab_mass = mean target probability inside the draft vocabulary (depth-1 positions)."""

    alpha_per_depth: list[float]
    alpha_std_over_sequences: list[float]
    positions_per_depth: list[int]
    draft_vocab_mass: float
    rrs_alpha_per_depth: dict[int, list[float]]  # children m -> alpha_d(m), d = 1..depths


def _to_target_vocab(head: Eagle3Head, draft_logits: torch.Tensor) -> torch.Tensor:
    """(n, D) -> (n, V) float32, -inf outside the draft vocabulary."""
    full = draft_logits.new_full((draft_logits.shape[0], head.config.vocab_size), float("-inf"), dtype=torch.float32)
    full[:, head.draft_to_target.to(draft_logits.device)] = draft_logits.float()
    return full


@torch.no_grad()
def head_alpha_per_depth(
    target, head: Eagle3Head, sequences: Sequence[tuple[Sequence[int], int]], params: SamplingParams,
    draft_params: SamplingParams, depths: int = 4,
) -> HeadAlpha:
    """Teacher-forced acceptance of ``head`` at depths 1..``depths`` on ``sequences`` ((tokens,
    prompt length) pairs: the target's own continuations). Positions: the predictions of the
    continuation tokens i (prompt length <= i < len(tokens)), as in ``distill.check``; at depth k a
    round rooted k - 1 tokens earlier is needed, so tokens i < k + 1 are left out."""
    device = next(head.parameters()).device
    embedding = target.get_input_embeddings()
    per_depth: list[list[np.ndarray]] = [[] for _ in range(depths)]
    rrs: dict[int, list[list[np.ndarray]]] = {m: [[] for _ in range(depths)] for m in TREE_CHILDREN if m > 1}
    masses = []
    for tokens, prompt_len in sequences:
        tokens = list(tokens)
        n = len(tokens)
        if n < 3 or prompt_len >= n:
            continue
        ids = torch.tensor([tokens], device=next(target.parameters()).device)
        features, logits = target_features(target, ids, head.config.aux_layer_ids)
        # entry j pairs feature j with token j + 1 and predicts token j + 2: entries 0..n-3 predict
        # the tokens 2..n-1 of the sequence (the target's distribution of token j + 2 is logits[j + 1])
        feats = features[:, : n - 2].to(device=device, dtype=next(head.parameters()).dtype)
        embeds = embedding(ids[:, 1 : n - 1]).to(device=device, dtype=feats.dtype)
        steps = head.unrolled(feats, embeds, depths)
        for k in range(1, depths + 1):
            first = max(k - 1, prompt_len - 2)  # entry j predicts token j + 2, a continuation token
            if first > n - 3:
                continue
            entries = slice(first, n - 2)
            p = logits_to_probs(logits[0, first + 1 : n - 1].float().cpu(), params)
            q = logits_to_probs(_to_target_vocab(head, steps[k - 1][0, entries]).cpu(), draft_params)
            per_depth[k - 1].append(acceptance_per_position(p, q))
            for m, rows in rrs.items():
                rows[k - 1].append(rrs_acceptance(p, q, m))
            if k == 1:
                masses.append(p[:, head.draft_to_target.cpu().numpy()].sum(axis=-1))
    alphas, stds, counts = [], [], []
    for rows in per_depth:
        values = np.concatenate(rows) if rows else np.zeros(0)
        alphas.append(float(values.mean()) if len(values) else 0.0)
        stds.append(float(np.std([r.mean() for r in rows if len(r)])) if rows else 0.0)
        counts.append(int(len(values)))
    mass = float(np.concatenate(masses).mean()) if masses else 0.0
    by_children = {1: alphas}
    for m, rows in rrs.items():
        by_children[m] = [float(np.concatenate(r).mean()) if r else 0.0 for r in rows]
    return HeadAlpha(alphas, stds, counts, mass, by_children)


@torch.no_grad()
def head_step_timer(target, head: Eagle3Head, params: SamplingParams, context: Sequence[int]):
    """A callable timing one decode-time head draft step in ms: the embedding of the last drafted
    token, one midlayer pass over one entry attending to ``len(context)`` cached entries (built by a
    prefill over the context's target features), the LM head and q over the target vocabulary."""
    device = next(head.parameters()).device
    dtype = next(head.parameters()).dtype
    ids = torch.tensor([list(context)], device=next(target.parameters()).device)
    features, _ = target_features(target, ids, head.config.aux_layer_ids)
    n = ids.shape[1]
    embedding = target.get_input_embeddings()
    feats = features[:, : n - 1].to(device=device, dtype=dtype)
    embeds = embedding(ids[:, 1:]).to(device=device, dtype=dtype)
    prefill = head.step(head.project(feats), embeds, torch.arange(n - 1, device=device)[None])
    keys, values, out = prefill.keys, prefill.values, prefill.out[:, -1:]
    last = ids[:, -1:]
    position = torch.tensor([[n - 1]], device=device)

    def step() -> float:
        tic = time.perf_counter()
        embed = embedding(last).to(device=device, dtype=dtype)
        result = head.step(out, embed, position, keys, values)
        logits_to_probs(head.target_logits(result.out[0]), params)
        return 1e3 * (time.perf_counter() - tic)

    return step


def chain_predictions(alpha_per_depth: Sequence[float], cost_ratio: float) -> list[dict]:
    """For L = 1..len(alpha_per_depth): expected tokens per round (block efficiency)
    1 + sum_{d<=L} prod_{i<=d} alpha_i and predicted speedup BE / (1 + L c)."""
    rows, survive, expected = [], 1.0, 1.0
    for length, alpha in enumerate(alpha_per_depth, start=1):
        survive *= alpha
        expected += survive
        rows.append({"L": length, "block_efficiency": expected, "speedup": expected / (1.0 + length * cost_ratio)})
    return rows


def tree_predictions(rrs_alpha_per_depth: dict[int, list[float]], cost_ratio: float,
                     shapes: Sequence[Sequence[int]] = TREE_SHAPES) -> list[dict]:
    """Predicted tokens per round and speedup of each tree shape (children per level) whose
    branchings and depth were measured (see the module docstring for the assumptions)."""
    rows = []
    for shape in shapes:
        if len(shape) > len(rrs_alpha_per_depth[1]) or any(k not in rrs_alpha_per_depth for k in shape):
            continue
        survive, expected, parents, head_rows = 1.0, 1.0, 1, 0
        for depth, children in enumerate(shape):
            head_rows += parents  # one head query per node whose children are drawn
            survive *= rrs_alpha_per_depth[children][depth]
            expected += survive
            parents *= children
        rows.append({"shape": list(shape), "nodes": sum(int(np.prod(shape[: d + 1])) for d in range(len(shape))),
                     "head_rows": head_rows, "block_efficiency": expected,
                     "speedup": expected / (1.0 + head_rows * cost_ratio)})
    return rows


@dataclass
class HeadCheckReport:
    target: str
    draft: str
    head_format: str
    vocab_compatible: bool
    vocab_problems: list[str]
    temperature: float
    draft_temperature: float
    alpha: float
    alpha_per_depth: list[float]
    alpha_std_over_sequences: float
    alpha_std_per_depth: list[float]
    positions: int
    positions_per_depth: list[int]
    draft_vocab_size: int
    draft_vocab_mass: float
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
    rrs_alpha_per_depth: dict[str, list[float]]
    by_tree: list[dict]
    dtype: str = "fp32"

    def to_dict(self) -> dict:
        return asdict(self)


def build_head_report(target_name: str, draft_name: str, head_format: str, head: Eagle3Head, params: SamplingParams,
                      draft_params: SamplingParams, measured: HeadAlpha, cost: dict, sequences: int, dtype: str) -> HeadCheckReport:
    rows = chain_predictions(measured.alpha_per_depth, cost["cost_ratio"])
    best = max(rows, key=lambda r: r["speedup"])
    label, reasons = verdict(measured.alpha_per_depth[0], cost["cost_ratio"], best["speedup"])
    reasons = [r.replace("(closed form, constant acceptance)", "(chain, measured acceptance per depth)") for r in reasons]
    reasons.append(f"the draft vocabulary ({head.config.draft_vocab_size} tokens) holds {measured.draft_vocab_mass:.3f} "
                   "of the target's probability mass on these positions (q = 0 outside it)")
    return HeadCheckReport(
        target=target_name, draft=draft_name, head_format=head_format, vocab_compatible=True, vocab_problems=[],
        temperature=params.temperature, draft_temperature=draft_params.temperature,
        alpha=measured.alpha_per_depth[0], alpha_per_depth=measured.alpha_per_depth,
        alpha_std_over_sequences=measured.alpha_std_over_sequences[0],
        alpha_std_per_depth=measured.alpha_std_over_sequences, positions=measured.positions_per_depth[0],
        positions_per_depth=measured.positions_per_depth, draft_vocab_size=head.config.draft_vocab_size,
        draft_vocab_mass=measured.draft_vocab_mass, sequences=sequences, cost_ratio=cost["cost_ratio"],
        target_ms_per_token=cost["target_ms_per_token"], draft_ms_per_token=cost["draft_ms_per_token"],
        best_L=best["L"], predicted_speedup=best["speedup"], predicted_block_efficiency=best["block_efficiency"],
        verdict=label, reasons=reasons, by_L=rows,
        rrs_alpha_per_depth={str(m): a for m, a in measured.rrs_alpha_per_depth.items()},
        by_tree=tree_predictions(measured.rrs_alpha_per_depth, cost["cost_ratio"]), dtype=dtype,
    )


__all__ = ["HeadAlpha", "HeadCheckReport", "build_head_report", "chain_predictions", "head_alpha_per_depth",
           "head_step_timer", "measure_cost_ratio"]
