"""``verispec draft check --draft head|DIR`` for EAGLE-3 heads (the measurements live in
``distill.head_check``; the pair-draft path is ``cli.draft.run_check``, which dispatches here;
the inputs both measure on come from ``cli.check_inputs``)."""

from __future__ import annotations

import json

import torch

from verispec.errors import ConfigError


def is_head_draft(name: str | None) -> bool:
    """True for 'head' and for a directory holding a head (any format) or a head training run."""
    if name is None:
        return False
    if name == "head":
        return True
    from verispec.models.head_formats import resolve_head_dir

    try:
        resolve_head_dir(name)
    except ConfigError:
        return False
    return True


def run_head_check(args) -> int:
    from verispec.cli.check_inputs import DTYPES, check_sequences, set_threads
    from verispec.core.sampling import SamplingParams
    from verispec.distill import check, head_check
    from verispec.models.head_formats import head_format, load_any_head, resolve_head_dir
    from verispec.models.default import load_model

    set_threads(args.threads)
    dtype = DTYPES[args.dtype]
    directory = resolve_head_dir(args.draft)  # before the target loads: a missing head fails fast
    target, tokenizer = load_model(args.target, dtype, args.device)
    head = load_any_head(directory, target.config, dtype=dtype, device=args.device)  # vocabulary/width checked
    params = SamplingParams(args.temperature, args.top_k, args.top_p)
    draft_temperature = args.temperature if args.draft_temperature is None else args.draft_temperature
    draft_params = SamplingParams(draft_temperature, args.top_k, args.top_p)
    sequences = check_sequences(args, target, tokenizer)
    if args.depths < 1:
        raise ConfigError(f"--depths must be >= 1, got {args.depths}")
    measured = head_check.head_alpha_per_depth(target, head, sequences, params, draft_params, args.depths)
    context = check.context_for_timing(sequences, args.timing_context)
    with torch.no_grad():
        cost = check.measure_cost_ratio(check.decode_step_timer(target, params, context),
                                        head_check.head_step_timer(target, head, draft_params, context), args.timing_steps)
    name = "head" if args.draft == "head" else str(directory)
    report = head_check.build_head_report(args.target, name, head_format(directory), head, params, draft_params,
                                          measured, cost, len(sequences), args.dtype)
    if args.json:
        print(json.dumps(report.to_dict(), indent=1))
    else:
        _print_head_check(report)
    return 0


def _print_head_check(report) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(width=140)
    console.print(f"[bold]draft check[/bold]: target {report.target}, head {report.draft} ({report.head_format} format, "
                  f"{report.dtype})")
    depths = ", ".join(f"{a:.3f}" for a in report.alpha_per_depth)
    console.print(f"acceptance per depth (T = {report.temperature}, draft T = {report.draft_temperature}, "
                  f"{report.sequences} sequences, {report.positions} depth-1 positions): {depths}")
    console.print(f"draft vocabulary {report.draft_vocab_size} tokens, target mass inside it {report.draft_vocab_mass:.3f}")
    console.print(f"cost: target {report.target_ms_per_token:.2f} ms/token, head step {report.draft_ms_per_token:.2f} ms, "
                  f"c = {report.cost_ratio:.3f}")
    table = Table(title="chain of L head steps: tokens per round 1 + sum_d prod_{i<=d} alpha_i, speedup / (1 + L c)")
    for column in ("L", "block efficiency", "predicted speedup"):
        table.add_column(column, justify="right")
    for row in report.by_L:
        mark = " *" if row["L"] == report.best_L else ""
        table.add_row(str(row["L"]) + mark, f"{row['block_efficiency']:.2f}", f"{row['speedup']:.2f}x")
    console.print(table)
    console.print(f"best L = {report.best_L}, predicted speedup {report.predicted_speedup:.2f}x")
    for children, alphas in report.rrs_alpha_per_depth.items():
        if children == "1":
            continue  # the chain's alpha per depth above
        console.print(f"RRS acceptance per depth with {children} i.i.d. children: " + ", ".join(f"{a:.3f}" for a in alphas))
    if report.by_tree:
        trees = Table(title="token trees (children per level, RRS; assumes a head query row costs one step and the "
                            "target forward does not grow with the tree)")
        for column in ("shape", "nodes", "head rows", "block efficiency", "predicted speedup"):
            trees.add_column(column, justify="right")
        for row in report.by_tree:
            trees.add_row(",".join(map(str, row["shape"])), str(row["nodes"]), str(row["head_rows"]),
                          f"{row['block_efficiency']:.2f}", f"{row['speedup']:.2f}x")
        console.print(trees)
    console.print(f"verdict: [bold]{report.verdict}[/bold]")
    for reason in report.reasons:
        console.print(f"  - {reason}")
