"""Distillation: train a draft to match the target's next-token distributions (KL on logits).

Loss per position: KL(p || q) with p the target's distribution at ``kl_temperature`` over its
stored top-k tokens that lie in the draft's sub-vocabulary S (renormalized: tokens outside S get
q = 0 whatever the draft learns, so they carry no gradient) and q = softmax(draft logits over S /
kl_temperature). AdamW on the draft's trainable parameters, linear warm-up then cosine decay,
gradient clipping, optional bf16 autocast. Every ``eval_every`` steps the token-level acceptance
alpha = mean sum_x min(p(x), q(x)) at ``eval_temperature`` (and the greedy agreement, alpha at
T = 0) is measured on held-out records; every ``checkpoint_every`` steps the model, optimizer,
schedule, step and RNG states are saved and ``resume`` continues from them bit for bit.
"""

from __future__ import annotations

import json
import math
import random
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from verispec.distill.data import count_positions, load_shards
from verispec.distill.student import parameter_count, trainable_parameters
from verispec.errors import ConfigError

CHECKPOINT = "checkpoint.pt"
HISTORY = "history.jsonl"


@dataclass
class TrainConfig:
    steps: int = 1000
    batch_sequences: int = 8
    context: int = 256  # prompt tokens kept before each continuation (the draft reads this much)
    lr: float = 1e-3
    min_lr_ratio: float = 0.1
    warmup: int = 50
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    kl_temperature: float = 1.0
    eval_temperature: float = 0.6
    eval_every: int = 100
    checkpoint_every: int = 100
    reload_every: int = 0  # re-read the training shards every N steps (data written while training)
    max_minutes: float = 0.0  # stop (and save) after this wall time; 0 = no limit
    stop_at: int = 0  # stop (and save) at this step, schedule unchanged (resume later); 0 = run to `steps`
    autocast_bf16: bool = False
    seed: int = 0
    log_every: int = 10


@dataclass
class TrainState:
    step: int = 0
    positions_seen: int = 0
    seconds: float = 0.0
    best_alpha: float = -1.0
    history: list = field(default_factory=list)


# ----------------------------------------------------------------------------- batching
def sub_index_table(student) -> torch.Tensor:
    """(V,) long: position of each vocabulary token in the draft's sub-vocabulary, -1 outside it."""
    head = student.lm_head
    table = torch.full((head.vocab_size,), -1, dtype=torch.long)
    table[head.token_ids.cpu()] = torch.arange(len(head.token_ids))
    return table


def _target_start(record: dict) -> int:
    return int(record.get("target_start", record["prompt_len"]))


def make_batch(records: list[dict], context: int) -> dict:
    """Right-padded student inputs and the teacher rows aligned with the predicted positions.

    For record r with first predicted token n (``target_start``) and tokens x_0..x_{m-1}: inputs
    x_s..x_{m-2} with s = max(0, n - context) at their absolute positions; the output at position
    t >= n - 1 is compared with teacher row t - (n - 1).
    """
    inputs, starts = [], []
    for r in records:
        start = max(0, _target_start(r) - context)
        inputs.append(r["tokens"][start:-1].long())
        starts.append(start)
    width = max(len(x) for x in inputs)
    ids = torch.zeros(len(records), width, dtype=torch.long)
    mask = torch.zeros(len(records), width, dtype=torch.long)
    positions = torch.zeros(len(records), width, dtype=torch.long)
    rows_b, rows_t = [], []
    for b, (x, start, r) in enumerate(zip(inputs, starts, records)):
        ids[b, : len(x)] = x
        mask[b, : len(x)] = 1
        positions[b, : len(x)] = torch.arange(start, start + len(x))
        first = _target_start(r) - 1 - start
        n_rows = r["topk_ids"].shape[0]
        rows_b += [b] * n_rows
        rows_t += list(range(first, first + n_rows))
    cat = lambda key: torch.cat([r[key] for r in records])  # noqa: E731
    return {
        "input_ids": ids,
        "attention_mask": mask,
        "position_ids": positions,
        "rows": (torch.tensor(rows_b), torch.tensor(rows_t)),
        "topk_ids": cat("topk_ids").long(),
        "topk_logits": cat("topk_logits").float(),
        "lse": cat("lse").float(),
        "lse_eval": cat("lse_eval").float(),
    }


def student_sub_logits(student, batch: dict) -> torch.Tensor:
    """Draft logits over its sub-vocabulary at the teacher rows, (P, |S|) float32."""
    device = next(student.parameters()).device
    hidden = student.model(
        input_ids=batch["input_ids"].to(device),
        attention_mask=batch["attention_mask"].to(device),
        position_ids=batch["position_ids"].to(device),
        use_cache=False,
    ).last_hidden_state
    rows_b, rows_t = batch["rows"]
    selected = hidden[rows_b.to(device), rows_t.to(device)]
    return student.lm_head.sub_logits(selected).float()


def teacher_targets(batch: dict, table: torch.Tensor, temperature: float, device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(sub-vocabulary index (P, k), renormalized teacher probs over top-k ∩ S (P, k), teacher mass in top-k ∩ S (P,))."""
    index = table[batch["topk_ids"]]
    inside = index >= 0
    logits = batch["topk_logits"] / temperature
    logits = logits.masked_fill(~inside, float("-inf"))
    probs = torch.softmax(logits, dim=-1).nan_to_num(0.0)
    mass = (torch.exp(batch["topk_logits"] - batch["lse"][:, None]) * inside).sum(-1)
    return index.clamp_min(0).to(device), probs.to(device), mass.to(device)


def distill_loss(sub_logits: torch.Tensor, batch: dict, table: torch.Tensor, temperature: float) -> torch.Tensor:
    """Mean over positions of KL(p~ || q), p~ the teacher over top-k ∩ S renormalized, q = softmax(logits/T) over S."""
    index, probs, _ = teacher_targets(batch, table, temperature, sub_logits.device)
    log_q = torch.log_softmax(sub_logits / temperature, dim=-1).gather(-1, index)
    entropy_term = torch.where(probs > 0, probs * torch.log(probs.clamp_min(1e-30)), torch.zeros_like(probs))
    return (entropy_term - probs * log_q).sum(-1).mean()


# --------------------------------------------------------------------------- evaluation
@torch.no_grad()
def evaluate(student, records: list[dict], temperature: float = 0.6, context: int = 256, batch_sequences: int = 8) -> dict:
    """alpha = mean sum_x min(p(x), q(x)) at ``temperature`` over the held-out continuation
    positions (p exact on the stored top-k, a lower bound missing at most the mass outside it),
    alpha at T = 0 (greedy agreement), and the mean KL at temperature 1 as trained."""
    was_training = student.training
    student.eval()
    table = sub_index_table(student)
    total = {"alpha": 0.0, "alpha_greedy": 0.0, "kl": 0.0, "outside_topk_mass": 0.0, "positions": 0}
    for first in range(0, len(records), batch_sequences):
        batch = make_batch(records[first : first + batch_sequences], context)
        sub = student_sub_logits(student, batch).cpu()
        index = table[batch["topk_ids"]]
        inside = index >= 0
        p_eval = torch.exp(batch["topk_logits"] / temperature - batch["lse_eval"][:, None])
        q_eval = torch.softmax(sub / temperature, dim=-1).gather(-1, index.clamp_min(0)) * inside
        total["alpha"] += float(torch.minimum(p_eval, q_eval).sum(-1).sum())
        total["outside_topk_mass"] += float((1 - p_eval.sum(-1)).clamp_min(0).sum())
        draft_top = student.lm_head.token_ids.cpu()[sub.argmax(-1)]
        total["alpha_greedy"] += float((draft_top == batch["topk_ids"][:, 0]).sum())
        total["kl"] += float(distill_loss(sub, batch, table, 1.0)) * len(index)
        total["positions"] += len(index)
    student.train(was_training)
    n = max(total["positions"], 1)
    return {
        "alpha": total["alpha"] / n,
        "alpha_greedy": total["alpha_greedy"] / n,
        "kl": total["kl"] / n,
        "outside_topk_mass": total["outside_topk_mass"] / n,
        "positions": total["positions"],
        "temperature": temperature,
    }


# ------------------------------------------------------------------------------ training
def learning_rate(step: int, config: TrainConfig) -> float:
    if step < config.warmup:
        return config.lr * (step + 1) / config.warmup
    progress = min(1.0, (step - config.warmup) / max(1, config.steps - config.warmup))
    floor = config.min_lr_ratio
    return config.lr * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress)))


def _rng_state() -> dict:
    return {"torch": torch.get_rng_state(), "python": random.getstate()}


def _set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])


def save_checkpoint(
    path: Path, student, optimizer, state: TrainState, config: TrainConfig, sampler: random.Random, order: list[int]
) -> None:
    staging = path.with_suffix(".tmp")
    torch.save(
        {
            "model": student.state_dict(),
            "model_config": student.config.to_dict(),
            "optimizer": optimizer.state_dict(),
            "state": asdict(state),
            "train_config": asdict(config),
            "rng": _rng_state(),
            "sampler": sampler.getstate(),
            "order": list(order),  # the rest of the current epoch
        },
        staging,
    )
    staging.replace(path)


def export_draft(student, out_dir: str | Path, tokenizer=None, dtype: torch.dtype = torch.bfloat16) -> Path:
    """Save a HF model directory (config.json + model.safetensors [+ tokenizer]) loadable with
    ``verispec.models.default.load_model`` (after ``import verispec.models.default_draft``)."""
    import copy

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    model = copy.deepcopy(student).to(dtype)
    model.config.dtype = str(dtype).replace("torch.", "")
    model.save_pretrained(out_dir)
    if tokenizer is not None:
        tokenizer.save_pretrained(out_dir)
    return out_dir


def _append_history(out_dir: Path, record: dict) -> None:
    with (out_dir / HISTORY).open("a") as handle:
        handle.write(json.dumps(record) + "\n")


def train(
    student,
    train_source: str | Path | list[dict],
    eval_records: list[dict],
    out_dir: str | Path,
    config: TrainConfig,
    tokenizer=None,
    resume: bool = False,
    device: str = "cpu",
    progress: bool = True,
    on_eval=None,
) -> TrainState:
    """Train ``student`` (fp32 master weights) on records (a shard directory or a list), with
    periodic evaluation, checkpoints (``out_dir/checkpoint.pt``), the best draft by alpha exported
    to ``out_dir/best`` and the last one to ``out_dir/final``. Returns the final TrainState."""
    from tqdm import tqdm

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    student.to(device).train()
    params = trainable_parameters(student)
    if not params:
        raise ConfigError("the draft has no trainable parameter")
    optimizer = torch.optim.AdamW(params, lr=config.lr, weight_decay=config.weight_decay, betas=(0.9, 0.98))
    state = TrainState()
    sampler = random.Random(config.seed)
    torch.manual_seed(config.seed)
    checkpoint_path = out_dir / CHECKPOINT
    if resume:
        if not checkpoint_path.is_file():
            raise ConfigError(f"--resume: no checkpoint at {checkpoint_path}; start without --resume")
        saved = torch.load(checkpoint_path, weights_only=False, map_location=device)
        student.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        state = TrainState(**saved["state"])
        _set_rng_state(saved["rng"])
        sampler.setstate(saved["sampler"])

    def read_train():
        return list(train_source) if isinstance(train_source, list) else load_shards(train_source)

    records = read_train()
    order: list[int] = saved["order"] if resume else []
    if not records:
        raise ConfigError(f"no training records in {train_source}; generate data first")
    table = sub_index_table(student)
    meta = {"parameters": parameter_count(student), "train_positions": count_positions(records), "config": asdict(config)}
    (out_dir / "run.json").write_text(json.dumps(meta, indent=1))
    autocast = torch.autocast(device_type=torch.device(device).type, dtype=torch.bfloat16, enabled=config.autocast_bf16)

    def run_eval():
        result = evaluate(student, eval_records, config.eval_temperature, config.context)
        record = {"step": state.step, "positions_seen": state.positions_seen, "seconds": round(state.seconds, 1), **result}
        state.history.append(record)
        _append_history(out_dir, record)
        if result["alpha"] > state.best_alpha:
            state.best_alpha = result["alpha"]
            export_draft(student, out_dir / "best", tokenizer)
        if on_eval is not None:
            on_eval(record)
        return result

    if state.step == 0 and eval_records and not state.history:
        run_eval()
    bar = tqdm(total=config.steps, initial=state.step, desc="distill", disable=not progress, dynamic_ncols=True)
    started = time.perf_counter() - state.seconds
    loss_avg = None
    while state.step < config.steps:
        if config.max_minutes and time.perf_counter() - started > 60 * config.max_minutes:
            break
        if config.stop_at and state.step >= config.stop_at:
            break
        if config.reload_every and state.step % config.reload_every == 0 and state.step:
            fresh = read_train()
            if len(fresh) != len(records):
                records, order = fresh, []
        if len(order) < config.batch_sequences:
            order = list(range(len(records)))
            sampler.shuffle(order)
        members, order = order[: config.batch_sequences], order[config.batch_sequences :]
        batch = make_batch([records[i] for i in members], config.context)
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(state.step, config)
        with autocast:
            sub = student_sub_logits(student, batch)
        loss = distill_loss(sub.float(), batch, table, config.kl_temperature)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, config.grad_clip)
        optimizer.step()
        state.step += 1
        state.positions_seen += len(batch["lse"])
        state.seconds = time.perf_counter() - started
        loss_value = loss.item()
        loss_avg = loss_value if loss_avg is None else 0.9 * loss_avg + 0.1 * loss_value
        bar.update(1)
        if state.step % config.log_every == 0:
            bar.set_postfix(kl=f"{loss_avg:.3f}", alpha=f"{state.best_alpha:.3f}", pos=state.positions_seen)
            _append_history(out_dir, {"step": state.step, "train_kl": loss_avg, "lr": learning_rate(state.step, config), "seconds": round(state.seconds, 1)})
        if eval_records and config.eval_every and state.step % config.eval_every == 0:
            run_eval()
        if config.checkpoint_every and state.step % config.checkpoint_every == 0:
            save_checkpoint(checkpoint_path, student, optimizer, state, config, sampler, order)
    bar.close()
    if eval_records and (not state.history or state.history[-1]["step"] != state.step):
        run_eval()
    save_checkpoint(checkpoint_path, student, optimizer, state, config, sampler, order)
    export_draft(student, out_dir / "final", tokenizer)
    return state
