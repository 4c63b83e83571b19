"""``verispec`` command line: generate, audit (and the commands of later layers)."""

from __future__ import annotations

import os

# Before anything imports torch (its OpenMP runtime reads this once, when it loads): OpenMP threads
# that wait at a barrier sleep instead of spinning. Spinning threads steal the core that a thread
# of the same decode (or another process) needs, and a 2-thread decode on a 2-core machine with
# one other busy process collapsed from ~15 to < 0.2 tokens/s; sleeping costs little when idle.
# An explicit OMP_WAIT_POLICY in the environment wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import argparse  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402

from verispec.cli import flags  # noqa: E402
from verispec.errors import VerispecError  # noqa: E402
from verispec.models import BACKENDS  # noqa: E402


_int_list = flags.positive_int_list


def _add_sampling_flags(parser: argparse.ArgumentParser, default_temperature: float = 1.0) -> None:
    parser.add_argument("--temperature", type=flags.temperature, default=default_temperature, help=f"0 = greedy (default {default_temperature})")
    parser.add_argument("--top-k", type=flags.int_at_least(0, " (0 disables it)"), default=0, help="0 disables (default)")
    parser.add_argument("--top-p", type=flags.top_p, default=1.0, help="1.0 disables (default)")
    parser.add_argument("--draft-temperature", type=flags.temperature, default=None, help="draft's own temperature (default: same as target)")


def _add_model_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--target", default=None, help="target model directory, or gemma3-270m (optional extra) (default: embedded SmolLM2-135M-Instruct)")
    parser.add_argument("--draft", default=None,
                        help="draft model directory, 'head' (the shipped EAGLE-3 draft head) or a head directory, "
                             "'tree' (target-aware token trees, the default), 'ngram' "
                             "(stochastic n-gram / prompt lookup), or 'default' (the shipped trained draft if any, else ngram)")
    parser.add_argument("--dtype", default="auto", choices=["auto", "fp32", "bf16", "fp16"],
                        help="auto (default): bf16 where the CPU has native bf16, else fp32")
    parser.add_argument("--device", type=flags.device, default="cpu", help="cpu (default) or cuda[:N] (needs a CUDA build of torch)")
    parser.add_argument("--backend", default="auto", choices=BACKENDS,
                        help="model forward: auto (default): llama.cpp on a CPU without native bf16 when the "
                             "llamacpp extra is installed and the target has a GGUF, else torch with the native Llama "
                             "forward when the model qualifies; native; transformers' own forward; or llamacpp: the "
                             "target's GGUF file through llama.cpp "
                             "(--target default, gemma3-270m or a .gguf path; a .gguf --draft runs there too; "
                             "needs pip install 'verispec[llamacpp]')")


def _add_threads_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--threads", type=flags.int_at_least(1), default=None,
                        help="torch CPU threads (default: the cores this process may use; waiting threads sleep "
                             "(OMP_WAIT_POLICY=PASSIVE) so a busy machine slows decoding down instead of stalling it)")


def build_parser() -> argparse.ArgumentParser:
    parser = flags.OneLineParser(prog="verispec", description="Speculative decoding with every verification rule, proven exact.")
    sub = parser.add_subparsers(dest="command", required=True)

    gen = sub.add_parser("generate", help="decode a prompt with a target/draft pair and a verification rule")
    gen.add_argument("prompt", nargs="?", default=None, help="the prompt (or give --prompts-file)")
    gen.add_argument("--prompts-file", default=None, metavar="FILE",
                     help="decode many prompts together as a batch: a text file with one prompt per line, or a .jsonl "
                          "file with one object per line holding \"prompt\" (a string) or \"turns\" (a list; the first "
                          "turn is used)")
    gen.add_argument("--max-batch", type=flags.int_at_least(1), default=8,
                     help="with --prompts-file: most sequences decoded at once (default 8); the rest join as others finish")
    _add_model_flags(gen)
    gen.add_argument("--method", default=None,
                     help="registry name (verispec methods) or 'ar' for plain sampling (default: qfree with the "
                          "token-tree draft, gumbel with any other draft)")
    gen.add_argument("-K", "--num-drafts", type=flags.int_at_least(1), default=1)
    gen.add_argument("-L", "--draft-len", type=flags.draft_len, default=None,
                     help="draft length, or 'auto' (default): chosen per round for chain rules (gumbel, sd, bv, ...), 4 otherwise")
    gen.add_argument("--tree", type=_int_list, default=None, help="children per depth for tree methods, e.g. 2,2,1")
    _add_sampling_flags(gen)
    gen.add_argument("--max-new-tokens", type=flags.int_at_least(1), default=128)
    gen.add_argument("--seed", type=flags.seed, default=0, help="a whole number in [0, 2**63) (default 0)")
    gen.add_argument("--batch-invariant", action="store_true",
                     help="shape every target forward so rows do not depend on the forward they share (measured once "
                          "per machine): a seed then gives --method ar's text bit for bit in bf16 too; native runner, "
                          "one prompt at a time")
    gen.add_argument("--adjacency", default=None, metavar="FILE",
                     help="start the token-tree draft from this table of the target's next tokens (written by "
                          "AdjacencyTable.save, e.g. benchmarks/warm_adjacency.py --build after decoding your own "
                          "prompts) instead of an empty one. Drafts only: the text is the same with any table")
    _add_threads_flag(gen)
    gen.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    gen.add_argument("--no-chat", action="store_true", help="do not wrap the prompt in the chat template")
    gen.add_argument("--stream", action="store_true", help="print text as blocks are accepted")
    gen.add_argument("--stats-json", default=None, help="write step statistics and summary to this file")
    gen.add_argument("--verifier", default=None, help="SPRINTER verifier file (method sprinter)")

    audit = sub.add_parser("audit", help="exact output laws of every rule on toy models (ALGORITHMS.md §14)")
    audit.add_argument("--json", action="store_true", help="print the records as a JSON list")
    audit.add_argument("--rules", default=None, help="comma-separated subset of rules")
    audit.add_argument("--no-controls", action="store_true", help="leave out the negative controls")

    sub.add_parser("methods", help="list the registered verification rules")

    demo = sub.add_parser("demo", help="the main job: a method vs plain decoding on HumanEval prompts")
    _add_model_flags(demo)
    demo.add_argument("--method", default=None, help="default: qfree with the token-tree draft, gumbel with any other")
    demo.add_argument("-K", "--num-drafts", type=flags.int_at_least(1), default=1)
    demo.add_argument("-L", "--draft-len", type=flags.draft_len, default=None, help="draft length or 'auto' (default)")
    demo.add_argument("--prompts", type=flags.int_at_least(1), default=3, help="number of HumanEval prompts")
    demo.add_argument("--max-new-tokens", type=flags.int_at_least(1), default=64)
    demo.add_argument("--seed", type=flags.seed, default=0, help="a whole number in [0, 2**63) (default 0)")
    _add_threads_flag(demo)
    _add_sampling_flags(demo)

    from verispec.cli.sprinter import add_sprinter_parser

    add_sprinter_parser(sub)

    from verispec.cli.bench import add_bench_arguments, add_theory_arguments

    add_bench_arguments(sub.add_parser("bench", help="benchmark sweep: methods x datasets x K x L x temperature x seeds"))
    add_theory_arguments(sub.add_parser("theory", help="closed-form expectations: expected block efficiency and speedup"))

    from verispec.cli.draft import add_distill_parser, add_draft_parser

    add_draft_parser(sub)
    add_distill_parser(sub)

    from verispec.cli.export_head import add_export_head_parser

    add_export_head_parser(sub)
    from verispec.cli.head import add_train_head_parser

    add_train_head_parser(sub)

    from verispec.cli.compare import add_compare_parser

    add_compare_parser(sub)

    from verispec.cli.serve import add_serve_parser

    add_serve_parser(sub, _add_model_flags, _int_list)
    return parser


def main(argv=None) -> int:
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as done:  # --help (0) or a bad flag (2, its one line already printed)
        return done.code if isinstance(done.code, int) else 2
    try:
        if args.command in ("generate", "demo", "serve") and args.backend == "auto":
            from verispec.models.backend_choice import choose_backend

            # llama.cpp or torch from the CPU kind and the flags (docs/llamacpp.md), before any model loads
            from verispec.cli.generate import mean_prompt_tokens

            choice = choose_backend(args.target, args.draft, args.method, args.dtype, args.device,
                                    command=args.command, max_new_tokens=getattr(args, "max_new_tokens", None),
                                    prompt_tokens=mean_prompt_tokens(args) if args.command != "serve" else None,
                                    batch_invariant=getattr(args, "batch_invariant", False))
            args.backend, args.backend_reason = choice.backend, choice.reason
        if args.command == "generate" and args.method == "sprinter":
            from verispec.cli.generate import check_prompt_source
            from verispec.cli.sprinter import run_generate_sprinter

            check_prompt_source(args)

            return run_generate_sprinter(args)
        if args.command == "sprinter":
            from verispec.cli.sprinter import run_sprinter

            return run_sprinter(args)
        if args.command == "generate":
            from verispec.cli.generate import run_generate

            return run_generate(args)
        if args.command == "audit":
            return run_audit_command(args)
        if args.command == "methods":
            from verispec.verify.registry import METHODS

            for spec in METHODS.values():
                print(f"{spec.name:16s} {'lossless' if spec.lossless else 'LOSSY   '}  {spec.draft:6s} {spec.description}")
            return 0
        if args.command == "demo":
            from verispec.cli.generate import run_demo

            return run_demo(args)
        if args.command == "draft":
            from verispec.cli.draft import run_draft

            return run_draft(args)
        if args.command == "distill":
            from verispec.cli.draft import run_distill

            return run_distill(args)
        if args.command == "export-head":
            from verispec.cli.export_head import run_export_head

            return run_export_head(args)
        if args.command == "train-head":
            from verispec.cli.head import run_train_head

            return run_train_head(args)
        if args.command == "bench":
            from verispec.cli.bench import run_bench

            return run_bench(args)
        if args.command == "compare":
            from verispec.cli.compare import run_compare

            return run_compare(args)
        if args.command == "serve":
            from verispec.cli.serve import run_serve

            return run_serve(args)
        if args.command == "theory":
            from verispec.cli.bench import run_theory

            return run_theory(args)
    except VerispecError as error:
        return flags.fail(args.command, str(error))
    return 1


def run_audit_command(args) -> int:
    from verispec.audit import records_as_dicts, run_audit

    rules = args.rules.split(",") if args.rules else None
    records = run_audit(rules, include_controls=not args.no_controls)
    if args.json:
        print(json.dumps(records_as_dicts(records), indent=1))
    else:
        from rich.console import Console
        from rich.table import Table

        table = Table(title="verispec audit: exact output laws on toy models (|Δ| = max |output law − target law|)")
        for column in ["rule", "claims lossless", "V", "L", "K", "draft", "max|Δ| block", "max|Δ| 3-4 tokens", "E[τ] enum", "E[τ] closed form", "verdict", "s"]:
            table.add_column(column, justify="right" if column not in ("rule", "draft", "verdict") else "left")
        for r in records:
            verdict = "exact" if r.exact else ("NOT exact (lossy, as labelled)" if not r.lossless else "FAILS CLAIM")
            table.add_row(
                r.rule + (" (control)" if r.negative_control else ""),
                "yes" if r.lossless else "no",
                str(r.V), str(r.L), str(r.K), r.draft,
                f"{r.max_abs_error:.1e}",
                "-" if r.max_abs_error_multi is None else f"{r.max_abs_error_multi:.1e}",
                f"{r.expected_len_enumerated:.6f}",
                "-" if r.expected_len_closed_form is None else f"{r.expected_len_closed_form:.6f}",
                verdict,
                f"{r.seconds:.2f}",
            )
        Console(width=200).print(table)
    return 0 if all(r.claim_holds for r in records) else 1


if __name__ == "__main__":
    sys.exit(main())
