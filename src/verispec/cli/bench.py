"""``verispec bench`` (sweep, record, replay, anchor) and ``verispec theory``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from verispec.cli import flags
from verispec.errors import ConfigError
from verispec.models import BACKENDS

# Flags that map onto BenchConfig keys (argparse dest -> config key); None = not given.
CONFIG_FLAGS = (
    "methods", "dataset", "limit", "K", "L", "temperatures", "max_new_tokens", "seeds", "out", "target",
    "draft", "dtype", "device", "backend", "threads", "top_k", "top_p", "chat", "record", "record_limit", "record_per_prompt", "anchor", "warmup", "progress",
)


def add_bench_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of ``verispec bench``; every default is None so that a --config file fills the gaps."""
    parser.add_argument("--config", default=None, help="YAML or TOML file with the same keys as the flags")
    parser.add_argument("--methods", default=None, help="comma-separated registry names, e.g. sd,bv,spectr (default qfree: token trees)")
    parser.add_argument("--dataset", action="append", default=None,
                        help="'humaneval' or a Spec-Bench-format JSONL file (repeatable, or comma list)")
    parser.add_argument("--limit", type=flags.int_at_least(1), default=None, help="prompts per dataset (per category for Spec-Bench files; default 10)")
    parser.add_argument("-K", "--num-drafts", dest="K", default=None, help="comma list of K (default 1)")
    parser.add_argument("-L", "--draft-len", dest="L", default=None, help="comma list of L (default 4)")
    parser.add_argument("--temperatures", default=None, help="comma list, 0 = greedy (default 0)")
    parser.add_argument("--max-new-tokens", type=flags.int_at_least(1), default=None, help="default 128")
    parser.add_argument("--seeds", default=None, help="comma list (default 0)")
    parser.add_argument("--out", default=None, help="output folder (default bench_out)")
    parser.add_argument("--target", default=None, help="target model directory, or gemma3-270m (optional extra) (default: embedded SmolLM2-135M-Instruct)")
    parser.add_argument("--draft", default=None,
                        help="draft model directory, 'head' (the shipped EAGLE-3 head) or a head directory, 'tree' or 'ngram' (default: token trees for q-free methods, ngram otherwise)")
    parser.add_argument("--dtype", default=None, choices=["auto", "fp32", "bf16", "fp16"],
                        help="auto (default): bf16 where the CPU has native bf16, else fp32")
    parser.add_argument("--device", type=flags.device, default=None, help="cpu (default) or cuda[:N] (needs a CUDA build of torch)")
    parser.add_argument("--backend", default=None, choices=BACKENDS,
                        help="model forward: native Llama forward when possible (auto, default), transformers', or "
                             "llamacpp (the target's GGUF through llama.cpp; see docs/llamacpp.md)")
    parser.add_argument("--threads", type=flags.int_at_least(1), default=None, help="torch CPU threads (default: torch's choice)")
    parser.add_argument("--top-k", type=flags.int_at_least(0, " (0 disables it)"), default=None)
    parser.add_argument("--top-p", type=flags.top_p, default=None)
    parser.add_argument("--no-chat", dest="chat", action="store_const", const=False, default=None,
                        help="do not wrap prompts in the chat template")
    parser.add_argument("--record", action="store_const", const=True, default=None,
                        help="store the verified draft trees (full float64 vectors) under OUT/trees for --replay")
    parser.add_argument("--record-limit", type=flags.int_at_least(1), default=None, help="rounds recorded per configuration (default 32)")
    parser.add_argument("--record-per-prompt", type=flags.int_at_least(1), default=None,
                        help="rounds recorded per prompt (default: no per-prompt cap), so a recording spans many prompts")
    parser.add_argument("--anchor", action="store_const", const=True, default=None,
                        help="add transformers' generate and assisted generation (needs --draft DIR)")
    parser.add_argument("--no-warmup", dest="warmup", action="store_const", const=False, default=None)
    parser.add_argument("--no-progress", dest="progress", action="store_const", const=False, default=None)
    parser.add_argument("--replay", default=None, metavar="DIR",
                        help="re-verify the trees recorded in DIR with --methods (no models are run)")
    parser.add_argument("--replay-seed", type=flags.seed, default=0, help="base seed of the common random numbers")
    parser.add_argument("--replay-repeats", type=flags.int_at_least(1), default=1, help="verifications per recorded tree (default 1)")
    parser.add_argument("--batch-size", default=None, metavar="B,...",
                        help="decode the prompts in batches of each size (e.g. 1,2,4,8) with generate_batch and report total "
                             "and per-sequence tokens/s, block efficiency and the speedup over plain batched decoding of "
                             "the same size (writes OUT/batch_summary.md and .json)")


def add_theory_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="theory_command", required=True)
    speedup = sub.add_parser("speedup", help="expected BE and speedup for L = 1..16 at acceptance alpha and draft cost ratio c")
    speedup.add_argument("--alpha", type=flags.probability, required=True, help="per-token acceptance rate in [0, 1]")
    speedup.add_argument("-L", "--draft-len", type=flags.int_at_least(1), default=4, help="the draft length to report (marked in the table)")
    speedup.add_argument("--cost-ratio", type=flags.number_at_least(0), default=0.0, help="draft forward cost / target forward cost (c)")
    speedup.add_argument("--max-L", type=flags.int_at_least(1), default=16, help="largest L in the table (default 16)")


def run_bench(args) -> int:
    if args.replay:
        return run_replay(args)
    from verispec.bench.config import make_config
    from verispec.bench.report import markdown_table, paper_tables, write_reports
    from verispec.bench.runner import Sweep

    batch_sizes = None
    if args.batch_size is not None:
        from verispec.bench.batch_sweep import parse_batch_sizes

        batch_sizes = parse_batch_sizes(args.batch_size)
        clashing = [flag for flag, given in (("--record", args.record), ("--anchor", args.anchor)) if given]
        if clashing:
            raise ConfigError(f"--batch-size measures batched decoding only; drop {' and '.join(clashing)} (or run them without --batch-size)")
    overrides = {key: getattr(args, key) for key in CONFIG_FLAGS}
    config = make_config(args.config, overrides)
    if config.threads:
        import torch

        torch.set_num_threads(config.threads)
    target_model, tokenizer, draft = load_models(config)
    sweep = Sweep(config, target_model, tokenizer, draft)
    if batch_sizes is not None and sweep.specs:
        return run_batch_bench(sweep, batch_sizes)
    if not sweep.specs:
        # nothing would be measured but the plain-decoding baseline: say why instead of exiting 0
        for skipped in dict.fromkeys(f"{s.method} K={s.num_drafts} L={s.draft_len}: {s.reason}" for s in sweep.skipped):
            print(f"skipped {skipped}", file=sys.stderr)
        print("error: every configuration of the sweep was skipped (reasons above); fix --methods / -K / -L",
              file=sys.stderr)
        return 2
    result = sweep.run()
    paths = write_reports(config.out, result.records, result.rows, result.skipped, result.meta)
    for table in paper_tables(result.rows):
        print(markdown_table(table) + "\n")
    for skipped in dict.fromkeys(f"{s.method} K={s.num_drafts} L={s.draft_len}: {s.reason}" for s in result.skipped):
        print(f"skipped {skipped}", file=sys.stderr)
    print(f"wrote {', '.join(str(p) for p in paths.values())}", file=sys.stderr)
    if result.recordings:
        print(f"recorded draft trees: {len(result.recordings)} files under {Path(config.out) / 'trees'}", file=sys.stderr)
    return 0


def run_batch_bench(sweep, batch_sizes: list[int]) -> int:
    """``--batch-size``: every method and plain decoding in batches of each size (bench.batch_sweep)."""
    from tqdm import tqdm

    from verispec.bench.batch_sweep import BatchSweep, batch_meta, batch_table, write_batch_reports
    from verispec.bench.report import markdown_table

    config = sweep.config
    for skipped in dict.fromkeys(f"{s.method} K={s.num_drafts} L={s.draft_len}: {s.reason}" for s in sweep.skipped):
        print(f"skipped {skipped}", file=sys.stderr)
    # groups wrap around to full batches: ceil(prompts / B) groups of B per dataset and size
    per_pass = sum(-(-len(d.prompts) // size) * size for d in sweep.datasets for size in batch_sizes)
    total = per_pass * len(config.temperatures) * len(config.seeds) * (1 + len(sweep.specs))
    with tqdm(total=total, desc="verispec bench --batch-size", unit="seq", disable=not config.progress, dynamic_ncols=True) as bar:
        rows = BatchSweep(sweep, batch_sizes).run(progress=bar.update)
    paths = write_batch_reports(config.out, rows, batch_meta(config, batch_sizes))
    print(markdown_table(batch_table(rows)))
    print(f"wrote {', '.join(str(p) for p in paths.values())}", file=sys.stderr)
    return 0


def load_models(config):
    """(target model, tokenizer, draft) where draft is None (per method: token trees for q-free
    rules, n-gram otherwise), 'ngram', 'tree' or a loaded model."""
    from verispec.cli.generate import resolve_dtype
    from verispec.models.default import load_model
    from verispec.models.llamacpp import is_gguf_source, load_gguf_tokenizer

    if config.backend == "llamacpp":  # the target stays a GGUF name or path, opened on llama.cpp by the sweep
        target_model, tokenizer = config.target or "default", load_gguf_tokenizer(config.target)
    else:
        target_model, tokenizer = load_model(config.target, resolve_dtype(config.dtype, config.device or "cpu"), config.device)
    if config.draft is None:
        return target_model, tokenizer, None
    if is_gguf_source(config.draft):  # opened once on llama.cpp by the sweep
        return target_model, tokenizer, config.draft
    if config.draft in ("default", "ngram", "tree"):
        return target_model, tokenizer, "ngram" if config.draft == "default" else config.draft
    from verispec.engine.head_drafter import is_head_source

    if is_head_source(config.draft):  # "head" or a head directory: the decoder loads it
        return target_model, tokenizer, config.draft
    draft_model, _ = load_model(config.draft, resolve_dtype(config.dtype, config.device or "cpu"), config.device)
    return target_model, tokenizer, draft_model


def run_replay(args) -> int:
    from verispec.bench.config import normalise_keys, read_config_file
    from verispec.bench.replay import replay, replay_markdown, write_replay

    methods = args.methods
    if methods is None and args.config:
        methods = normalise_keys(read_config_file(args.config)).get("methods")
    if methods is None:
        raise ConfigError("--replay needs --methods, e.g. --methods sd,bv,gbv-mod")
    methods = normalise_keys({"methods": methods})["methods"]
    report = replay(args.replay, methods, args.replay_seed, args.replay_repeats)
    paths = write_replay(report, args.out or args.replay)
    print(replay_markdown(report))
    print(f"wrote {', '.join(str(p) for p in paths.values())}", file=sys.stderr)
    return 0


def speedup_table(alpha: float, cost_ratio: float, max_len: int = 16) -> list[tuple[int, float, float]]:
    """(L, expected BE, expected speedup) for L = 1..max_len: BE = (1 - a^(L+1)) / (1 - a),
    speedup = BE / (1 + L c) (Leviathan et al.; closed_forms.expected_speedup)."""
    from verispec.theory.closed_forms import expected_block_efficiency, expected_speedup

    return [
        (draft_len, expected_block_efficiency(alpha, draft_len), expected_speedup(alpha, draft_len, draft_len * cost_ratio))
        for draft_len in range(1, max_len + 1)
    ]


def run_theory(args) -> int:
    if args.theory_command != "speedup":  # pragma: no cover - argparse restricts the choices
        raise ConfigError(f"unknown theory command {args.theory_command!r}")
    if not 0.0 <= args.alpha <= 1.0:
        raise ConfigError(f"--alpha must lie in [0, 1], got {args.alpha}")
    if args.cost_ratio < 0:
        raise ConfigError(f"--cost-ratio must be >= 0, got {args.cost_ratio}")
    if args.draft_len < 1 or args.max_L < 1:
        raise ConfigError(f"-L and --max-L must be >= 1, got {args.draft_len} and {args.max_L}")
    table = speedup_table(args.alpha, args.cost_ratio, max(args.max_L, args.draft_len))
    best = max(table, key=lambda row: row[2])
    print(f"alpha = {args.alpha:g}, cost ratio c = {args.cost_ratio:g}: BE = (1-a^(L+1))/(1-a), speedup = BE / (1 + L c)")
    print(f"{'L':>3} {'expected BE':>12} {'speedup':>9}")
    for draft_len, block_efficiency, speedup in table:
        marks = " <- best" if draft_len == best[0] else ""
        marks += " <- -L" if draft_len == args.draft_len else ""
        print(f"{draft_len:>3} {block_efficiency:>12.4f} {speedup:>9.4f}{marks}")
    chosen = table[args.draft_len - 1]
    print(f"L = {args.draft_len}: expected BE {chosen[1]:.4f}, expected speedup {chosen[2]:.4f}")
    print(f"best L = {best[0]}: expected BE {best[1]:.4f}, expected speedup {best[2]:.4f}")
    return 0
