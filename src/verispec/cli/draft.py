"""``verispec draft check``, ``verispec draft temperature`` and ``verispec distill``."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from verispec.cli.check_inputs import DTYPES, check_sequences, set_threads
from verispec.errors import ConfigError

NGRAM = "ngram"
SHIPPED = ("default-draft", "shipped")


def _float_list(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x.strip()]


# ------------------------------------------------------------------------------ parsers
def add_draft_parser(sub) -> None:
    draft = sub.add_parser("draft", help="draft-model tooling: check a target/draft pair, sweep the draft temperature")
    draft_sub = draft.add_subparsers(dest="draft_command", required=True)
    check = draft_sub.add_parser("check", help="vocabulary, cost ratio c, acceptance alpha, predicted speedup, verdict")
    _add_pair_flags(check)
    check.add_argument("--draft-temperature", type=float, default=None, help="draft's own temperature (default: same)")
    check.add_argument("--json", action="store_true", help="print the report as JSON")
    check.add_argument("--depths", type=int, default=4, help="EAGLE-3 head drafts: acceptance measured at depths 1..N")
    temperature = draft_sub.add_parser("temperature", help="alpha for each draft temperature at a fixed target temperature")
    _add_pair_flags(temperature)
    temperature.add_argument("--grid", type=_float_list, default=[0.0, 0.2, 0.4, 0.6, 0.8, 1.0, 1.2, 1.5],
                             help="draft temperatures to try (comma-separated)")
    temperature.add_argument("--json", action="store_true")


def _add_pair_flags(parser) -> None:
    parser.add_argument("--target", default="default", help="target model directory, 'default' (SmolLM2-135M-Instruct) or 'gemma3-270m' (optional extra)")
    parser.add_argument("--draft", default=NGRAM, help="draft model directory, 'ngram', 'default-draft' (the shipped one), 'head' (the shipped EAGLE-3 head) "
                        "or an EAGLE-3 head directory (verispec, eagle3 or speculators format; check only)")
    parser.add_argument("--prompts", default=None, help="prompt file (Spec-Bench JSONL, or one prompt a line); "
                        "default: held-out HumanEval 0-39 and Spec-Bench question_id %% 5 == 0 prompts")
    parser.add_argument("--sequences", default=None, help="directory of recorded target continuations (distill eval shards) to reuse")
    parser.add_argument("--num-prompts", type=int, default=16)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--max-prompt-tokens", type=int, default=384)
    parser.add_argument("--temperature", type=float, default=0.6, help="target temperature (0 = greedy)")
    parser.add_argument("--top-k", type=int, default=0)
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--timing-steps", type=int, default=30)
    parser.add_argument("--timing-context", type=int, default=200)
    parser.add_argument("--dtype", default="bf16", choices=list(DTYPES))
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0 = torch's default)")


def add_distill_parser(sub) -> None:
    distill = sub.add_parser("distill", help="train a draft from the target on domain prompts (KL on the target's logits)")
    distill.add_argument("--out", required=True, help="run directory: data/, checkpoint.pt, best/, final/, history.jsonl")
    distill.add_argument("--target", default="default")
    distill.add_argument("--data", default=None, help="data directory (train/ and eval/ shards); default OUT/data")
    distill.add_argument("--prompts", default=None, help="training prompt file; default: training split of HumanEval + Spec-Bench")
    distill.add_argument("--spec-bench", default=None, help="Spec-Bench question.jsonl (default: the development copy, if present)")
    distill.add_argument("--passes", type=int, default=1, help="continuations sampled per training prompt")
    distill.add_argument("--max-new-tokens", type=int, default=128)
    distill.add_argument("--max-prompt-tokens", type=int, default=384)
    distill.add_argument("--gen-batch", type=int, default=16, help="prompts per batched target generate call")
    distill.add_argument("--gen-temperatures", type=_float_list, default=[0.6, 0.8, 1.0])
    distill.add_argument("--prompt-positions", action="store_true", help="also distill on prompt positions (one extra target forward)")
    distill.add_argument("--eval-prompts", type=int, default=32, help="held-out prompts for alpha during training")
    distill.add_argument("--top-k", type=int, default=64, help="teacher logits kept per position")
    distill.add_argument("--data-only", action="store_true", help="generate the data and stop")
    distill.add_argument("--no-generate", action="store_true",
                         help="train on the shards already in the data directory (e.g. while another process writes more)")
    distill.add_argument("--hidden", type=int, default=256)
    distill.add_argument("--layers", type=int, default=2)
    distill.add_argument("--intermediate", type=int, default=None, help="MLP width (default 4 x hidden)")
    distill.add_argument("--sub-vocab", type=int, default=8192, help="output restricted to the N most frequent target tokens (0 = all)")
    distill.add_argument("--no-init-from-target", dest="init_from_target", action="store_false",
                         help="random embedding instead of the target's (projected) embedding")
    distill.add_argument("--init-layers", type=lambda t: [int(x) for x in t.split(",") if x.strip()], default=[],
                         help="copy these target layers into the draft (needs --hidden = target hidden)")
    distill.add_argument("--train-embedding", action="store_true", help="train the input embedding too (default frozen)")
    distill.add_argument("--steps", type=int, default=2000)
    distill.add_argument("--batch-size", type=int, default=8, help="sequences per step")
    distill.add_argument("--context", type=int, default=256)
    distill.add_argument("--lr", type=float, default=1e-3)
    distill.add_argument("--warmup", type=int, default=50)
    distill.add_argument("--kl-temperature", type=float, default=1.0)
    distill.add_argument("--eval-temperature", type=float, default=0.6)
    distill.add_argument("--eval-every", type=int, default=100)
    distill.add_argument("--checkpoint-every", type=int, default=100)
    distill.add_argument("--reload-every", type=int, default=0, help="re-read training shards every N steps")
    distill.add_argument("--max-minutes", type=float, default=0.0, help="stop training after this wall time (0 = none)")
    distill.add_argument("--autocast-bf16", action="store_true", help="bf16 autocast for the student (fp32 master weights)")
    distill.add_argument("--resume", action="store_true", help="continue from OUT/checkpoint.pt")
    distill.add_argument("--teacher-dtype", default="bf16", choices=list(DTYPES))
    distill.add_argument("--device", default="cpu", help="cpu or cuda")
    distill.add_argument("--seed", type=int, default=0)
    distill.add_argument("--threads", type=int, default=0)


# ------------------------------------------------------------------------------ helpers
def load_draft(name: str, dtype: torch.dtype, device: str):
    """(draft model or 'ngram', tokenizer or None, display name)."""
    import verispec.models.default_draft as default_draft  # registers the sub-vocabulary draft architecture
    from verispec.models.default import load_model

    if name == NGRAM:
        return NGRAM, None, NGRAM
    if name in SHIPPED:
        if not default_draft.default_draft_available():
            raise ConfigError("this install ships no default draft; give a draft directory or 'ngram'")
        name = str(default_draft.DEFAULT_DRAFT_DIR)
    try:
        model, tokenizer = load_model(name, dtype, device)
    except (OSError, ValueError) as error:
        if isinstance(error, ConfigError):
            raise
        raise ConfigError(f"cannot load draft {name!r}: {error}") from error
    return model, tokenizer, name


def pair_measurements(args):
    """Load the pair and compute what check and temperature share: sequences, target logits,
    draft rows (logits, or raw n-gram probabilities)."""
    from verispec.core.sampling import SamplingParams
    from verispec.distill import check
    from verispec.models.default import load_model

    set_threads(args.threads)
    dtype = DTYPES[args.dtype]
    target, tokenizer = load_model(args.target, dtype, args.device)
    draft, draft_tokenizer, draft_name = load_draft(args.draft, dtype, args.device)
    target_vocab = check.model_vocab_size(target)
    draft_vocab = target_vocab if draft == NGRAM else check.model_vocab_size(draft)
    problems = check.check_vocabularies(target_vocab, draft_vocab, tokenizer, draft_tokenizer)
    params = SamplingParams(args.temperature, args.top_k, args.top_p)
    if problems:
        return {"target": target, "draft": draft, "draft_name": draft_name, "problems": problems, "params": params}
    sequences = check_sequences(args, target, tokenizer)
    target_logits = check.sequence_logits(target, sequences)
    if draft == NGRAM:
        draft_rows = [check.ngram_probs(target_vocab, t, n) for t, n in sequences]
    else:
        draft_rows = check.sequence_logits(draft, sequences)
    return {
        "target": target, "draft": draft, "draft_name": draft_name, "problems": problems, "params": params,
        "sequences": sequences, "target_logits": target_logits, "draft_rows": draft_rows, "vocab": target_vocab,
    }


def run_draft(args) -> int:
    if args.draft_command == "check":
        return run_check(args)
    return run_temperature(args)


def _print_incompatible(args, measured) -> int:
    from verispec.distill import check

    if args.json:
        print(json.dumps({"target": args.target, "draft": measured["draft_name"], "vocab_compatible": False,
                          "vocab_problems": measured["problems"], "verdict": "incompatible"}, indent=1))
    check.require_compatible(measured["problems"])  # raises: the CLI prints the error and exits 2
    return 2


def run_check(args) -> int:
    from verispec.cli.head_check import is_head_draft, run_head_check
    from verispec.core.sampling import SamplingParams
    from verispec.distill import check

    if is_head_draft(args.draft):  # 'head' or an EAGLE-3 head directory (any format)
        return run_head_check(args)
    measured = pair_measurements(args)
    if measured["problems"]:
        return _print_incompatible(args, measured)
    params = measured["params"]
    draft_temperature = args.temperature if args.draft_temperature is None else args.draft_temperature
    draft_params = SamplingParams(draft_temperature, args.top_k, args.top_p)
    is_ngram = measured["draft"] == NGRAM
    alpha = check.alpha_from_logits(measured["target_logits"], measured["draft_rows"], params, draft_params, rows_are_probs=is_ngram)
    context = check.context_for_timing(measured["sequences"], args.timing_context)
    target_step = check.decode_step_timer(measured["target"], params, context)
    if is_ngram:
        draft_step = check.ngram_step_timer(measured["vocab"], draft_params, context)
    else:
        draft_step = check.decode_step_timer(measured["draft"], draft_params, context)
    cost = check.measure_cost_ratio(target_step, draft_step, args.timing_steps)
    report = check.build_report(args.target, measured["draft_name"], [], params, draft_params, alpha, cost,
                                len(measured["sequences"]), args.dtype)
    if args.json:
        print(json.dumps(report.to_dict(), indent=1))
    else:
        _print_check(report)
    return 0


def _print_check(report) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(width=140)
    console.print(f"[bold]draft check[/bold]: target {report.target}, draft {report.draft} ({report.dtype})")
    console.print("vocabulary: compatible (same size, same token strings)")
    console.print(
        f"alpha = {report.alpha:.3f} ± {report.alpha_std_over_sequences:.3f} (std over {report.sequences} sequences, "
        f"{report.positions} positions) at T = {report.temperature} (draft T = {report.draft_temperature})"
    )
    console.print(
        f"cost: target {report.target_ms_per_token:.2f} ms/token, draft {report.draft_ms_per_token:.2f} ms/token, "
        f"c = {report.cost_ratio:.3f}"
    )
    table = Table(title="closed form: block efficiency (1-a^(L+1))/(1-a), speedup BE/(1+Lc)")
    for column in ("L", "block efficiency", "predicted speedup"):
        table.add_column(column, justify="right")
    for row in report.by_L:
        mark = " *" if row["L"] == report.best_L else ""
        table.add_row(str(row["L"]) + mark, f"{row['block_efficiency']:.2f}", f"{row['speedup']:.2f}x")
    console.print(table)
    console.print(f"best L = {report.best_L}, predicted speedup {report.predicted_speedup:.2f}x")
    console.print(f"verdict: [bold]{report.verdict}[/bold]")
    for reason in report.reasons:
        console.print(f"  - {reason}")


def run_temperature(args) -> int:
    from verispec.cli.head_check import is_head_draft
    from verispec.distill import check

    if is_head_draft(args.draft):
        raise ConfigError("`draft temperature` does not sweep EAGLE-3 heads yet; run `draft check --draft HEAD "
                          "--draft-temperature T` for each temperature")
    measured = pair_measurements(args)
    if measured["problems"]:
        return _print_incompatible(args, measured)
    grid = sorted(set(args.grid) | {args.temperature})
    rows = check.sweep_draft_temperature(measured["target_logits"], measured["draft_rows"], measured["params"], grid,
                                         rows_are_probs=measured["draft"] == NGRAM)
    best = max(rows, key=lambda r: r["alpha"])
    if args.json:
        print(json.dumps({"target": args.target, "draft": measured["draft_name"], "temperature": args.temperature,
                          "sweep": rows, "best_draft_temperature": best["draft_temperature"]}, indent=1))
        return 0
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"alpha vs draft temperature, target T = {args.temperature} ({rows[0]['positions']} positions)")
    table.add_column("draft T", justify="right")
    table.add_column("alpha", justify="right")
    for row in rows:
        mark = " *" if row is best else ""
        table.add_row(f"{row['draft_temperature']:g}{mark}", f"{row['alpha']:.3f}")
    Console(width=120).print(table)
    print(f"best draft temperature {best['draft_temperature']:g} (alpha {best['alpha']:.3f}); "
          f"use it with --draft-temperature {best['draft_temperature']:g}")
    return 0


# ------------------------------------------------------------------------------ distill
def run_distill(args) -> int:
    from verispec.distill import data as distill_data
    from verispec.distill.student import build_student, freeze_embedding
    from verispec.distill.train import CHECKPOINT, TrainConfig, train
    from verispec.models.default import load_model
    from verispec.models.default_draft import SubVocabLlamaConfig, SubVocabLlamaForCausalLM

    set_threads(args.threads)
    out = Path(args.out)
    data_dir = Path(args.data) if args.data else out / "data"
    target, tokenizer = load_model(args.target, DTYPES[args.teacher_dtype], args.device)
    target.eval()

    eval_dir, train_dir = data_dir / "eval", data_dir / "train"
    heldout = distill_data.split_prompts("heldout", args.spec_bench)
    code = [p for p in heldout if p.category == "humaneval"]
    other = [p for p in heldout if p.category != "humaneval"]
    half = args.eval_prompts // 2 if other else args.eval_prompts
    eval_prompts = distill_data.interleave(code, half, seed=1) + distill_data.interleave(other, args.eval_prompts - half, seed=1)
    build = (lambda *a, **k: 0) if args.no_generate else distill_data.build_dataset
    build(
        target, tokenizer, eval_prompts, eval_dir, prefix="eval", max_new_tokens=min(96, args.max_new_tokens),
        max_prompt_tokens=args.max_prompt_tokens, batch_size=args.gen_batch, temperatures=(args.eval_temperature,),
        top_k=args.top_k, eval_temperature=args.eval_temperature, seed=1,
    )
    train_prompts = distill_data.read_prompt_file(args.prompts) if args.prompts else distill_data.split_prompts("train", args.spec_bench)
    written = build(
        target, tokenizer, train_prompts, train_dir, max_new_tokens=args.max_new_tokens,
        max_prompt_tokens=args.max_prompt_tokens, batch_size=args.gen_batch, temperatures=args.gen_temperatures,
        top_k=args.top_k, eval_temperature=args.eval_temperature, passes=args.passes, seed=args.seed,
        all_positions=args.prompt_positions,
    )
    print(f"data: {data_dir} ({written} new positions)", file=sys.stderr)
    if args.data_only:
        return 0

    records = distill_data.load_shards(train_dir)
    eval_records = distill_data.load_shards(eval_dir, "eval-*.pt")
    if args.resume and (out / CHECKPOINT).is_file():  # the student's shape and sub-vocabulary come from the checkpoint
        saved = torch.load(out / CHECKPOINT, weights_only=False, map_location="cpu")
        student = SubVocabLlamaForCausalLM(SubVocabLlamaConfig.from_dict(saved["model_config"])).float()
    else:
        vocab = int(target.config.vocab_size)
        size = args.sub_vocab or vocab
        special = [t for t in (tokenizer.all_special_ids if tokenizer is not None else []) if t < vocab]
        sub_ids = distill_data.sub_vocabulary(records, vocab, size, always=special) if size < vocab else None
        student = build_student(target, hidden=args.hidden, layers=args.layers, sub_vocab_ids=sub_ids,
                                intermediate=args.intermediate, init_from_target=args.init_from_target,
                                init_layers=args.init_layers, seed=args.seed)
    freeze_embedding(student, not args.train_embedding)
    config = TrainConfig(
        steps=args.steps, batch_sequences=args.batch_size, context=args.context, lr=args.lr, warmup=args.warmup,
        kl_temperature=args.kl_temperature, eval_temperature=args.eval_temperature, eval_every=args.eval_every,
        checkpoint_every=args.checkpoint_every, reload_every=args.reload_every, max_minutes=args.max_minutes,
        autocast_bf16=args.autocast_bf16, seed=args.seed,
    )
    del target, records
    state = train(student, train_dir, eval_records, out, config, tokenizer=tokenizer, resume=args.resume, device=args.device)
    last = state.history[-1] if state.history else {}
    print(
        f"distill: {state.step} steps, {state.positions_seen} positions, {state.seconds / 60:.1f} min; "
        f"alpha(T={args.eval_temperature}) last {last.get('alpha', float('nan')):.3f}, best {state.best_alpha:.3f}; "
        f"drafts in {out / 'best'} and {out / 'final'}",
        file=sys.stderr,
    )
    return 0
