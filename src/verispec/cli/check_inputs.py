"""What ``verispec draft check`` measures on, for a draft model and an EAGLE-3 head alike: the
dtype flag, the thread count, the held-out prompts and the target's sequences. Both ``cli.draft``
and ``cli.head_check`` read them from here, so neither imports the other's module back."""

from __future__ import annotations

import torch

from verispec.errors import ConfigError

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def set_threads(threads: int) -> None:
    """torch's CPU thread count; 0 keeps torch's default."""
    if threads:
        torch.set_num_threads(threads)


def check_prompts(args, tokenizer) -> list[list[int]]:
    """Token ids of ``args.num_prompts`` prompts: from ``args.prompts``, else half held-out HumanEval
    and half held-out Spec-Bench (the evaluation split, never trained on)."""
    from verispec.distill.data import encode_truncated, interleave, read_prompt_file, split_prompts

    if args.prompts:
        prompts = interleave(read_prompt_file(args.prompts), args.num_prompts, args.seed)
    else:
        heldout = split_prompts("heldout")
        code = [p for p in heldout if p.category == "humaneval"]
        other = [p for p in heldout if p.category != "humaneval"]
        half = args.num_prompts // 2 if other else args.num_prompts
        prompts = interleave(code, half, args.seed) + interleave(other, args.num_prompts - half, args.seed)
    return [encode_truncated(tokenizer, p.text, args.max_prompt_tokens) for p in prompts]


def check_sequences(args, target, tokenizer) -> list[tuple[list[int], int]]:
    """(tokens, prompt length) per sequence: recorded continuations from ``args.sequences`` when
    given, else the target's own continuations of ``check_prompts``."""
    from verispec.distill import check
    from verispec.distill.data import load_shards

    if args.sequences:
        records = load_shards(args.sequences, "*.pt")[: args.num_prompts]
        if not records:
            raise ConfigError(f"no recorded sequences in {args.sequences}")
        return [(r["tokens"].tolist(), int(r["prompt_len"])) for r in records]
    prompt_ids = check_prompts(args, tokenizer)
    return check.target_sequences(target, tokenizer, prompt_ids, args.max_new_tokens, args.temperature, args.seed)
