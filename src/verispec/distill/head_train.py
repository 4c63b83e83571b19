"""Training EAGLE-3 heads on stored target features (``verispec train-head``).

Loss (training-time test, EAGLE-3): ``Eagle3Head.unrolled`` gives S self-fed steps over each
window; step k's logits at entry j predict token j + 2 for a round rooted k - 1 entries earlier
(entries j < k - 1 are masked). Per entry, soft cross-entropy between the teacher's distribution
at ``loss_temperature`` over its stored top-k tokens inside the draft vocabulary D (renormalised:
tokens outside D get q = 0 whatever the head learns, so they carry no gradient) and the head's
softmax over D at the same temperature. Steps are weighted ``step_decay ** (k - 1)``.
AdamW, linear warm-up then cosine decay to ``min_lr_ratio``, gradient clipping, seeded batches
(the batch of step t depends only on the seed, t and the loaded shards: the data cursor is t).

Held-out evaluation (ALGORITHMS.md §2: the SD acceptance probability sum_x min(p, q) = 1 - TV):
at ``eval_temperature`` (0.6),
alpha_k = mean over continuation entries of sum_x min(p(x), q_k(x)) with p the stored teacher row
(exact where stored: p(x) = exp(logit_x / T - lse_eval)) and q_k the head's depth-k softmax at T
mapped to target ids (q = 0 outside D); plus greedy top-1 agreement per depth and the teacher mass
inside D (coverage).
"""

from __future__ import annotations

import dataclasses
import json
import math
import random
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F

from verispec.distill.data import sub_vocabulary
from verispec.distill.head_data import feature_shard_paths, load_feature_shards
from verispec.errors import ConfigError
from verispec.models.eagle_head import Eagle3Head, HeadConfig, save_head

CHECKPOINT = "checkpoint.pt"
HISTORY = "history.jsonl"


@dataclass
class HeadTrainConfig:
    steps: int = 4000
    batch_sequences: int = 8
    context: int = 512  # window length in head entries
    ttt_steps: int = 3
    step_decay: float = 0.8
    loss_temperature: float = 0.6
    lr: float = 5e-4
    min_lr_ratio: float = 0.05
    warmup: int = 100
    weight_decay: float = 0.05
    grad_clip: float = 0.5
    eval_temperature: float = 0.6
    eval_depths: int = 4
    eval_every: int = 200
    checkpoint_every: int = 200
    checkpoint_minutes: float = 5.0
    rescan_every: int = 0  # look for new feature shards every N steps (0 = never)
    max_minutes: float = 0.0  # stop (and save) after this wall time; 0 = no limit
    stop_at: int = 0  # stop (and save) at this step, schedule unchanged; 0 = run to `steps`
    seed: int = 0
    log_every: int = 10
    device: str = "cpu"


@dataclass
class HeadEval:
    """Held-out acceptance per depth (index 0 = depth 1) at ``temperature``."""

    alpha: list[float]
    top1: list[float]
    coverage: float
    entries: int
    temperature: float


@dataclass
class HeadTrainResult:
    step: int
    seconds: float
    train_positions: int
    last_eval: HeadEval | None
    best_alpha2: float
    run_dir: Path


# ----------------------------------------------------------------------------- teacher rows
def target_to_draft_table(draft_to_target: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """(V,) long: draft index of each target id, -1 outside the draft vocabulary."""
    table = torch.full((vocab_size,), -1, dtype=torch.long, device=draft_to_target.device)
    table[draft_to_target] = torch.arange(len(draft_to_target), device=draft_to_target.device)
    return table


def teacher_in_draft(topk_ids: torch.Tensor, topk_logits: torch.Tensor, table: torch.Tensor, temperature: float):
    """(P, k) teacher rows -> (draft indices (P, k), probabilities (P, k) of the teacher at
    ``temperature`` renormalised over the stored tokens inside D (0 for the others),
    has_mass (P,) bool: rows with at least one stored token inside D)."""
    draft = table[topk_ids.long()]
    inside = draft >= 0
    logits = (topk_logits.float() / temperature).masked_fill(~inside, float("-inf"))
    has_mass = inside.any(-1)
    probs = torch.softmax(logits.masked_fill(~has_mass[:, None], 0.0), dim=-1) * inside
    return draft.clamp(min=0), probs, has_mass


def soft_cross_entropy(draft_logits: torch.Tensor, draft_ids: torch.Tensor, probs: torch.Tensor, temperature: float) -> torch.Tensor:
    """(P, D) head logits, (P, k) teacher draft ids / probabilities -> (P,) -sum_x p(x) log q_T(x)."""
    log_q = torch.log_softmax(draft_logits.float() / temperature, dim=-1)
    return -(probs * log_q.gather(-1, draft_ids)).sum(-1)


def acceptance_rows(topk_ids, topk_logits, lse_eval, q_draft, table, temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row sum_x min(p(x), q(x)) and the teacher mass inside D.

    topk_ids/topk_logits (P, k): the teacher's stored tokens and raw logits; lse_eval (P,) the
    log-sum-exp of logits / temperature over the whole vocabulary (so p is exact on stored x);
    q_draft (P, D): the head's probabilities over D; table: ``target_to_draft_table``."""
    p = torch.exp(topk_logits.float() / temperature - lse_eval.float()[:, None])
    draft = table[topk_ids.long()]
    inside = draft >= 0
    q = q_draft.gather(-1, draft.clamp(min=0)) * inside
    return torch.minimum(p, q).sum(-1), (p * inside).sum(-1)


# ----------------------------------------------------------------------------- batches
def usable_entries(record: dict) -> int:
    """Head entries of a record: entry j needs token j + 1 (j = 0..n-2)."""
    return int(record["tokens"].shape[0]) - 1


def make_window_batch(records: list[dict], starts: list[int], context: int, embed_weight: torch.Tensor, device) -> dict:
    """Windows of ``context`` entries: record r from entry s -> features[s..], tokens[s+1..]
    (embedded), teacher rows s+1.. ; right-padded, ``valid`` (B, n) marks real entries,
    ``continuation`` (B, n) entries whose predicted token (j + 2) lies after the prompt."""
    lengths = [min(context, usable_entries(r) - s) for r, s in zip(records, starts)]
    width = max(lengths)
    batch = len(records)
    feat_dim = records[0]["features"].shape[-1]
    features = torch.zeros(batch, width, feat_dim, dtype=embed_weight.dtype)
    tokens = torch.zeros(batch, width, dtype=torch.long)
    valid = torch.zeros(batch, width, dtype=torch.bool)
    continuation = torch.zeros(batch, width, dtype=torch.bool)
    k = records[0]["topk_ids"].shape[-1]
    topk_ids = torch.zeros(batch, width, k, dtype=torch.long)
    topk_logits = torch.zeros(batch, width, k)
    lse_eval = torch.zeros(batch, width)
    for b, (r, s, n) in enumerate(zip(records, starts, lengths)):
        features[b, :n] = r["features"][s : s + n].to(features.dtype)
        tokens[b, :n] = r["tokens"][s + 1 : s + n + 1].long()
        valid[b, :n] = True
        predicted = torch.arange(s, s + n) + 2
        continuation[b, :n] = predicted >= int(r["prompt_len"])
        topk_ids[b, :n] = r["topk_ids"][s + 1 : s + n + 1].long()
        topk_logits[b, :n] = r["topk_logits"][s + 1 : s + n + 1].float()
        lse_eval[b, :n] = r["lse_eval"][s + 1 : s + n + 1].float()
    embed_weight = embed_weight.to(device)
    return {
        "features": features.to(device),
        "embeds": F.embedding(tokens.to(device), embed_weight),
        "valid": valid.to(device),
        "continuation": continuation.to(device),
        "topk_ids": topk_ids.to(device),
        "topk_logits": topk_logits.to(device),
        "lse_eval": lse_eval.to(device),
    }


def sample_windows(records: list[dict], weights: torch.Tensor, batch_sequences: int, context: int, seed: int, step: int):
    """The batch of ``step``: records drawn with probability proportional to their entries, a
    uniform window start each; a function of (seed, step, records) only (resume reproduces it)."""
    generator = torch.Generator().manual_seed(seed * 1_000_003 + step)
    picks = torch.multinomial(weights, batch_sequences, replacement=True, generator=generator).tolist()
    starts = []
    for i in picks:
        slack = max(0, usable_entries(records[i]) - context)
        starts.append(int(torch.randint(0, slack + 1, (1,), generator=generator)) if slack else 0)
    return [records[i] for i in picks], starts


def head_loss(head: Eagle3Head, batch: dict, table: torch.Tensor, config: HeadTrainConfig) -> tuple[torch.Tensor, list[float]]:
    """Weighted TTT loss over ``config.ttt_steps`` steps; returns (loss, per-step mean CE)."""
    steps = head.unrolled(batch["features"], batch["embeds"], config.ttt_steps)
    draft_ids, probs, has_mass = teacher_in_draft(
        batch["topk_ids"].flatten(0, 1), batch["topk_logits"].flatten(0, 1), table, config.loss_temperature)
    width = batch["valid"].shape[1]
    entry = torch.arange(width, device=table.device)
    total, weight_sum, per_step = 0.0, 0.0, []
    for k, logits in enumerate(steps, start=1):
        mask = (batch["valid"] & (entry >= k - 1)[None]).flatten() & has_mass
        ce = soft_cross_entropy(logits.flatten(0, 1)[mask], draft_ids[mask], probs[mask], config.loss_temperature)
        mean = ce.mean() if ce.numel() else logits.sum() * 0.0
        weight = config.step_decay ** (k - 1)
        total = total + weight * mean
        weight_sum += weight
        per_step.append(float(mean.detach()))
    return total / weight_sum, per_step


def accumulate_loss_backward(head: Eagle3Head, windows: list[tuple[dict, int]], embed_weight: torch.Tensor,
                             table: torch.Tensor, config: HeadTrainConfig) -> tuple[float, list[float], int]:
    """The gradient of ``head_loss`` over the padded batch of ``windows``, computed one window at a
    time (no padding: records vary in length, so a padded batch wastes most of its entries) and
    accumulated in the parameters' ``.grad``. Returns (loss, per-step mean CE, entries)."""
    device = table.device
    steps = config.ttt_steps
    prepared, counts = [], [0] * steps
    for record, start in windows:
        batch = make_window_batch([record], [start], config.context, embed_weight, device)
        draft_ids, probs, has_mass = teacher_in_draft(batch["topk_ids"][0], batch["topk_logits"][0], table,
                                                      config.loss_temperature)
        entry = torch.arange(has_mass.shape[0], device=device)
        masks = [has_mass & (entry >= k - 1) for k in range(1, steps + 1)]
        for k, mask in enumerate(masks):
            counts[k] += int(mask.sum())
        prepared.append((batch, draft_ids, probs, masks))
    weights = [config.step_decay**k for k in range(steps)]
    weight_sum = sum(weights)
    total, per_step, entries = 0.0, [0.0] * steps, 0
    for batch, draft_ids, probs, masks in prepared:
        outputs = head.unrolled(batch["features"], batch["embeds"], steps)
        loss = 0.0
        for k, (logits, mask) in enumerate(zip(outputs, masks)):
            if not counts[k]:
                continue
            ce = soft_cross_entropy(logits[0][mask], draft_ids[mask], probs[mask], config.loss_temperature).sum() / counts[k]
            per_step[k] += float(ce.detach())
            loss = loss + weights[k] / weight_sum * ce
        if torch.is_tensor(loss):
            loss.backward()
            total += float(loss.detach())
        entries += int(batch["valid"].sum())
    return total, per_step, entries


@torch.no_grad()
def evaluate_head(head: Eagle3Head, records: list[dict], embed_weight: torch.Tensor, *, temperature: float = 0.6,
                  depths: int = 4, context: int = 1024, batch_sequences: int = 4) -> HeadEval:
    """Held-out acceptance per depth 1..``depths`` over the continuation entries of ``records``
    (each record's last ``context`` entries)."""
    if not records:
        raise ConfigError("no held-out evaluation records")
    was_training = head.training
    head.eval()
    device = head.fc.weight.device
    table = target_to_draft_table(head.draft_to_target, head.config.vocab_size)
    sums = torch.zeros(depths, dtype=torch.float64)
    top1 = torch.zeros(depths, dtype=torch.float64)
    counts = torch.zeros(depths, dtype=torch.float64)
    coverage, coverage_n = 0.0, 0
    for first in range(0, len(records), batch_sequences):
        chunk = records[first : first + batch_sequences]
        starts = [max(0, usable_entries(r) - context) for r in chunk]
        batch = make_window_batch(chunk, starts, context, embed_weight, device)
        steps = head.unrolled(batch["features"], batch["embeds"], depths)
        width = batch["valid"].shape[1]
        entry = torch.arange(width, device=device)
        ids, logits, lse = (batch[k].flatten(0, 1) for k in ("topk_ids", "topk_logits", "lse_eval"))
        for k, draft_logits in enumerate(steps, start=1):
            mask = (batch["valid"] & batch["continuation"] & (entry >= k - 1)[None]).flatten()
            q = torch.softmax(draft_logits.flatten(0, 1)[mask].float() / temperature, dim=-1)
            alpha, mass = acceptance_rows(ids[mask], logits[mask], lse[mask], q, table, temperature)
            sums[k - 1] += float(alpha.double().sum())
            greedy = head.draft_to_target[q.argmax(-1)]
            top1[k - 1] += float((greedy == ids[mask][:, 0]).double().sum())
            counts[k - 1] += int(mask.sum())
            if k == 1:
                coverage += float(mass.double().sum())
                coverage_n += int(mask.sum())
    head.train(was_training)
    if counts[0] == 0:
        raise ConfigError("held-out records have no continuation entries to evaluate")
    counts = counts.clamp(min=1)
    return HeadEval(
        alpha=[round(float(x), 5) for x in sums / counts],
        top1=[round(float(x), 5) for x in top1 / counts],
        coverage=round(coverage / max(coverage_n, 1), 5),
        entries=int(counts[0]),
        temperature=temperature,
    )


@torch.no_grad()
def init_from_target(head: Eagle3Head, output_weight: torch.Tensor, final_norm_weight: torch.Tensor) -> None:
    """Start the head's output side in the target's output space (as EAGLE-1's frozen target LM
    head does): lm_head rows = the target's output-embedding rows of the draft vocabulary,
    norm = the target's final norm. output_weight (V, H), final_norm_weight (H,); H must equal the
    head's hidden size."""
    config = head.config
    if tuple(output_weight.shape) != (config.vocab_size, config.hidden_size):
        raise ConfigError(f"target output embedding {tuple(output_weight.shape)} does not match the head "
                          f"(vocab {config.vocab_size}, hidden {config.hidden_size}); train without --init-from-target")
    head.lm_head.weight.copy_(output_weight[head.draft_to_target.cpu()].to(head.lm_head.weight))
    head.norm.weight.copy_(final_norm_weight.to(head.norm.weight))


# ----------------------------------------------------------------------------- schedule, checkpoints
def learning_rate_factor(step: int, config: HeadTrainConfig) -> float:
    """Linear warm-up to 1, then cosine to ``min_lr_ratio`` at ``config.steps``."""
    if step < config.warmup:
        return (step + 1) / config.warmup
    progress = min(1.0, (step - config.warmup) / max(1, config.steps - config.warmup))
    return config.min_lr_ratio + (1 - config.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def _append_history(run_dir: Path, record: dict) -> None:
    with open(run_dir / HISTORY, "a") as handle:
        handle.write(json.dumps(record) + "\n")


def _with_recipe(head: Eagle3Head, recipe: dict) -> None:
    extra = dict(head.config.extra)
    extra["training"] = recipe
    head.config = dataclasses.replace(head.config, extra=extra)


def _feature_dirs(dirs, what: str) -> list[Path]:
    if not dirs:
        raise ConfigError(f"no {what} feature directory given")
    out = []
    for d in dirs:
        d = Path(d)
        if not d.is_dir():
            raise ConfigError(f"{what} feature directory {str(d)!r} not found; build it first "
                              "(verispec train-head --features-only ...)")
        out.append(d)
    return out


def _shard_list(dirs: list[Path]) -> list[Path]:
    return [p for d in dirs for p in feature_shard_paths(d)]


def train_head(
    run_dir: str | Path,
    train_dirs,
    eval_dirs,
    embed_weight: torch.Tensor,
    head_config: HeadConfig,
    config: HeadTrainConfig,
    *,
    always_ids=(),
    resume: bool = False,
    before_rescan=None,
    recipe: dict | None = None,
    vocab_records: list[dict] | None = None,
    target_output: tuple[torch.Tensor, torch.Tensor] | None = None,
    progress: bool = True,
) -> HeadTrainResult:
    """Train a head on the feature shards of ``train_dirs``; evaluate on ``eval_dirs``.

    embed_weight (V, H): the target's input embedding (frozen). head_config's draft_vocab_size D
    sets the sub-vocabulary (the D tokens with the most teacher mass in the training data loaded at
    the start, plus ``always_ids``). before_rescan: called (no arguments) before each rescan, e.g.
    to build features for new inputs. resume: continue from ``run_dir/checkpoint.pt`` exactly.
    vocab_records: records (distill.data or feature records) to rank the sub-vocabulary on instead
    of the training records loaded at the start (e.g. all target continuations written so far,
    when their features are still being built). target_output: (output embedding (V, H), final norm
    weight (H,)) to start from (``init_from_target``); None = random init."""
    from tqdm import tqdm

    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    train_dirs = _feature_dirs(train_dirs, "training")
    eval_dirs = _feature_dirs(eval_dirs, "held-out evaluation")
    device = torch.device(config.device)
    if config.ttt_steps < 1:
        raise ConfigError(f"--ttt-steps must be >= 1, got {config.ttt_steps}")
    if embed_weight.shape != (head_config.vocab_size, head_config.hidden_size):
        raise ConfigError(f"target embedding has shape {tuple(embed_weight.shape)}, the head needs "
                          f"({head_config.vocab_size}, {head_config.hidden_size})")
    embed_weight = embed_weight.detach().float().to(device)

    eval_paths = _shard_list(eval_dirs)
    if not eval_paths:
        raise ConfigError(f"no held-out feature shards in {[str(d) for d in eval_dirs]}; build them from the held-out "
                          "records first")
    eval_records = load_feature_shards(eval_paths, head_config.aux_layer_ids, allow_heldout=True)

    if resume and not (run_dir / CHECKPOINT).is_file():
        raise ConfigError(f"--resume: no {CHECKPOINT} in {run_dir}; start without --resume")
    saved = torch.load(run_dir / CHECKPOINT, weights_only=False) if resume else None
    loaded: list[str] = list(saved["loaded_shards"]) if saved else [str(p) for p in _shard_list(train_dirs)]
    if not loaded:
        raise ConfigError(f"no training feature shards in {[str(d) for d in train_dirs]}; build them first "
                          "(verispec train-head --features-only ...)")
    records = load_feature_shards([Path(p) for p in loaded], head_config.aux_layer_ids)
    if not records:
        raise ConfigError("the training feature shards hold no record")

    if saved:
        head_config = HeadConfig.from_dict(saved["head_config"])
        head = Eagle3Head(head_config).to(device)
        head.load_state_dict(saved["head"])
    else:
        vocab = sub_vocabulary(vocab_records or records, head_config.vocab_size, head_config.draft_vocab_size, always_ids)
        torch.manual_seed(config.seed)
        head = Eagle3Head(head_config, vocab)
        if target_output is not None:
            init_from_target(head, *target_output)
        head = head.to(device)
    table = target_to_draft_table(head.draft_to_target, head_config.vocab_size)

    decay, no_decay = [], []
    for name, param in head.named_parameters():
        (no_decay if param.ndim < 2 else decay).append(param)
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": config.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=config.lr, betas=(0.9, 0.95),
    )
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: learning_rate_factor(s, config))
    step, seconds, best_alpha2, positions_seen = 0, 0.0, -1.0, 0
    if saved:
        optimizer.load_state_dict(saved["optimizer"])
        scheduler.load_state_dict(saved["scheduler"])
        step, seconds = int(saved["step"]), float(saved["seconds"])
        best_alpha2, positions_seen = float(saved["best_alpha2"]), int(saved["positions_seen"])
        torch.set_rng_state(saved["rng"]["torch"])
        random.setstate(saved["rng"]["python"])
    weights = torch.tensor([float(usable_entries(r)) for r in records])

    def train_positions() -> int:
        return int(weights.sum())

    def checkpoint() -> None:
        state = {
            "head": head.state_dict(), "head_config": head.config.to_dict(), "optimizer": optimizer.state_dict(),
            "scheduler": scheduler.state_dict(), "step": step, "seconds": seconds, "best_alpha2": best_alpha2,
            "positions_seen": positions_seen, "loaded_shards": loaded, "config": asdict(config),
            "rng": {"torch": torch.get_rng_state(), "python": random.getstate()},
        }
        tmp = run_dir / (CHECKPOINT + ".tmp")
        torch.save(state, tmp)
        tmp.replace(run_dir / CHECKPOINT)

    def snapshot(directory: Path, evaluation: HeadEval | None) -> None:
        _with_recipe(head, {
            **(recipe or {}), "train_config": asdict(config), "step": step, "minutes": round(seconds / 60, 2),
            "train_sequences": len(records), "train_positions": train_positions(), "positions_seen": positions_seen,
            "eval_sequences": len(eval_records), "heldout_eval": asdict(evaluation) if evaluation else None,
        })
        save_head(head, directory)

    def run_eval() -> HeadEval:
        result = evaluate_head(head, eval_records, embed_weight, temperature=config.eval_temperature,
                               depths=max(config.eval_depths, config.ttt_steps), context=max(config.context, 1024))
        _append_history(run_dir, {"step": step, "seconds": round(seconds, 1), "eval": asdict(result)})
        return result

    last_eval: HeadEval | None = None
    end = config.stop_at or config.steps
    start_time = time.monotonic() - seconds
    last_checkpoint = time.monotonic()
    bar = tqdm(total=end, initial=step, desc="train-head", disable=not progress)
    head.train()
    stopped_by_time = False
    while step < end:
        if config.rescan_every and step and step % config.rescan_every == 0:
            if before_rescan is not None:
                before_rescan()
            new = [str(p) for p in _shard_list(train_dirs) if str(p) not in set(loaded)]
            if new:
                more = load_feature_shards([Path(p) for p in new], head_config.aux_layer_ids)
                loaded += new
                records += more
                weights = torch.cat([weights, torch.tensor([float(usable_entries(r)) for r in more])])
                _append_history(run_dir, {"step": step, "rescan": len(new), "train_positions": train_positions()})
        chosen, starts = sample_windows(records, weights, config.batch_sequences, config.context, config.seed, step)
        optimizer.zero_grad(set_to_none=True)
        loss, per_step, entries = accumulate_loss_backward(head, list(zip(chosen, starts)), embed_weight, table, config)
        grad_norm = torch.nn.utils.clip_grad_norm_(head.parameters(), config.grad_clip)
        optimizer.step()
        scheduler.step()
        step += 1
        positions_seen += entries
        seconds = time.monotonic() - start_time
        bar.update(1)
        if step % config.log_every == 0 or step == end:
            _append_history(run_dir, {"step": step, "seconds": round(seconds, 1), "loss": round(loss, 5),
                                      "ce_per_step": [round(x, 4) for x in per_step], "grad_norm": round(float(grad_norm), 4),
                                      "lr": scheduler.get_last_lr()[0], "positions_seen": positions_seen})
        timed_out = bool(config.max_minutes) and seconds >= 60 * config.max_minutes
        if step % config.eval_every == 0 or step == end or timed_out:
            last_eval = run_eval()
            if len(last_eval.alpha) > 1 and last_eval.alpha[1] > best_alpha2:
                best_alpha2 = last_eval.alpha[1]
                snapshot(run_dir / "best", last_eval)
        bar.set_postfix(loss=f"{loss:.3f}", a=",".join(f"{a:.2f}" for a in last_eval.alpha) if last_eval else "-")
        if step % config.checkpoint_every == 0 or time.monotonic() - last_checkpoint >= 60 * config.checkpoint_minutes or step == end or timed_out:
            checkpoint()
            last_checkpoint = time.monotonic()
        if timed_out:
            stopped_by_time = True
            break
    bar.close()
    if step >= config.steps or stopped_by_time:
        if last_eval is None:
            last_eval = run_eval()
        snapshot(run_dir / "final", last_eval)
        checkpoint()
    return HeadTrainResult(step, seconds, train_positions(), last_eval, best_alpha2, run_dir)
