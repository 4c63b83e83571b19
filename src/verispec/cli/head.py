"""``verispec train-head``: feature shards from target continuations and text, then EAGLE-3 head
training with training-time test (``distill.head_data``, ``distill.head_train``)."""

from __future__ import annotations

import json
from pathlib import Path

from verispec.errors import ConfigError


def add_train_head_parser(sub) -> None:
    p = sub.add_parser("train-head", help="train an EAGLE-3 draft head on the target's own features")
    p.add_argument("--out", required=True, help="run directory (checkpoint.pt, history.jsonl, best/, final/)")
    p.add_argument("--target", default=None, help="target model directory (default: the embedded SmolLM2-135M-Instruct)")
    p.add_argument("--records", action="append", default=[],
                   help="directory of distill.data record shards (training prompts + target continuations); repeatable. "
                        "Records of held-out prompts are dropped")
    p.add_argument("--eval-records", action="append", default=[],
                   help="directory of held-out distill.data record shards (evaluation only); repeatable")
    p.add_argument("--text-files", action="append", default=[],
                   help="glob of plain text / source files cut into <= --context-token chunks (extra training text); repeatable")
    p.add_argument("--text-max-tokens", type=int, default=100_000, help="tokens taken from each --text-files glob")
    p.add_argument("--features", default=None, help="feature shard directory (default OUT/features; train/ and eval/ inside)")
    p.add_argument("--features-only", action="store_true", help="build the feature shards and stop")
    p.add_argument("--no-build", action="store_true", help="train on the feature shards that exist, build nothing")
    p.add_argument("--top-k", type=int, default=64, help="teacher logits kept per position")
    p.add_argument("--draft-vocab", type=int, default=8192, help="draft vocabulary size D")
    p.add_argument("--steps", type=int, default=4000, help="schedule length in optimizer steps")
    p.add_argument("--batch", type=int, default=8, help="windows per step")
    p.add_argument("--context", type=int, default=512, help="window length (head entries) and text chunk length")
    p.add_argument("--ttt-steps", type=int, default=3, help="unrolled self-fed steps in the loss (EAGLE-3 training-time test)")
    p.add_argument("--step-decay", type=float, default=0.8, help="loss weight of TTT step k: decay ** (k - 1)")
    p.add_argument("--loss-temperature", type=float, default=0.6)
    p.add_argument("--lr", type=float, default=5e-4)
    p.add_argument("--warmup", type=int, default=100)
    p.add_argument("--weight-decay", type=float, default=0.05)
    p.add_argument("--grad-clip", type=float, default=0.5)
    p.add_argument("--eval-every", type=int, default=200)
    p.add_argument("--eval-temperature", type=float, default=0.6)
    p.add_argument("--checkpoint-every", type=int, default=200)
    p.add_argument("--checkpoint-minutes", type=float, default=5.0)
    p.add_argument("--rescan-every", type=int, default=0,
                   help="every N steps build features for new record shards and add them (0 = never)")
    p.add_argument("--max-minutes", type=float, default=0.0, help="stop (evaluate, save final/) after this wall time")
    p.add_argument("--stop-at", type=int, default=0, help="stop at this step with the schedule unchanged (resume later)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cpu", help="cpu or cuda")
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0 = torch's default)")
    p.add_argument("--resume", action="store_true", help="continue OUT/checkpoint.pt exactly")
    p.add_argument("--init-from-target", action="store_true",
                   help="start lm_head / norm from the target's output embedding rows / final norm (default: random)")
    p.add_argument("--no-progress", action="store_true")


def _target_output(target):
    """(output embedding (V, H), final norm weight (H,)) of a transformers causal LM."""
    norm = getattr(getattr(target, "model", None), "norm", None)
    if norm is None:
        raise ConfigError("--init-from-target: the target has no model.norm (Llama-style models only)")
    return target.get_output_embeddings().weight.detach().float().cpu(), norm.weight.detach().float().cpu()


def run_train_head(args) -> int:
    import torch

    from verispec.distill.head_data import build_record_features, build_text_features
    from verispec.distill.head_train import HeadTrainConfig, train_head
    from verispec.models.default import load_model
    from verispec.models.eagle_head import HeadConfig

    if args.threads:
        torch.set_num_threads(args.threads)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError("--device cuda: no CUDA device visible to torch; use --device cpu")
    out = Path(args.out)
    features = Path(args.features) if args.features else out / "features"
    train_dir, eval_dir = features / "train", features / "eval"
    train_dir.mkdir(parents=True, exist_ok=True)
    eval_dir.mkdir(parents=True, exist_ok=True)
    target, tokenizer = load_model(args.target, torch.float32, args.device)
    target.eval()
    head_config = HeadConfig.for_target(target.config, args.draft_vocab,
                                        extra={"target": str(args.target or "default")})
    aux = head_config.aux_layer_ids
    progress = not args.no_progress

    def build() -> None:
        if args.records:
            counts = build_record_features(target, args.records, train_dir, aux, top_k=args.top_k,
                                           eval_temperature=args.eval_temperature, progress=progress)
            if counts["shards"]:
                print(f"train features: {json.dumps(counts)}")
        for pattern in args.text_files:
            counts = build_text_features(target, tokenizer, pattern, train_dir, aux, context=args.context,
                                         max_tokens=args.text_max_tokens, top_k=args.top_k,
                                         eval_temperature=args.eval_temperature, progress=progress)
            if counts["shards"]:
                print(f"text features ({pattern}): {json.dumps(counts)}")

    if not args.no_build:
        if args.eval_records:
            build_record_features(target, args.eval_records, eval_dir, aux, top_k=args.top_k,
                                  eval_temperature=args.eval_temperature, allow_heldout=True, progress=progress)
        build()
    if args.features_only:
        return 0
    embed_weight = target.get_input_embeddings().weight.detach().float().cpu()
    config = HeadTrainConfig(
        steps=args.steps, batch_sequences=args.batch, context=args.context, ttt_steps=args.ttt_steps,
        step_decay=args.step_decay, loss_temperature=args.loss_temperature, lr=args.lr, warmup=args.warmup,
        weight_decay=args.weight_decay, grad_clip=args.grad_clip, eval_temperature=args.eval_temperature,
        eval_every=args.eval_every, checkpoint_every=args.checkpoint_every, checkpoint_minutes=args.checkpoint_minutes,
        rescan_every=args.rescan_every, max_minutes=args.max_minutes, stop_at=args.stop_at, seed=args.seed,
        device=args.device,
    )
    always = sorted(set(getattr(tokenizer, "all_special_ids", []) or [])) if tokenizer is not None else []
    recipe = {"records": [str(r) for r in args.records], "eval_records": [str(r) for r in args.eval_records],
              "text_files": list(args.text_files), "text_max_tokens": args.text_max_tokens, "top_k": args.top_k,
              "init_from_target": bool(args.init_from_target)}
    vocab_records = None
    if args.records and not args.resume:
        # rank the draft vocabulary on every continuation written so far (features may lag behind)
        from verispec.distill.head_data import prompt_is_heldout, record_shard_inputs

        vocab_records = []
        for path in record_shard_inputs(args.records):
            vocab_records += [r for r in torch.load(path, weights_only=False)["records"]
                              if "topk_logits" in r and not prompt_is_heldout(r.get("prompt_id", ""))]
        recipe["vocab_records"] = len(vocab_records)
        vocab_records = vocab_records or None  # records without teacher rows: rank on the features
    result = train_head(out, [train_dir], [eval_dir], embed_weight, head_config, config, always_ids=always,
                        resume=args.resume, before_rescan=None if args.no_build else build, recipe=recipe,
                        vocab_records=vocab_records, progress=progress,
                        target_output=_target_output(target) if args.init_from_target else None)
    summary = {"step": result.step, "minutes": round(result.seconds / 60, 2), "train_positions": result.train_positions,
               "best_alpha_depth2": result.best_alpha2,
               "heldout": None if result.last_eval is None else result.last_eval.__dict__}
    print(json.dumps(summary, indent=1))
    return 0
