"""Cost of the batch-invariant mode on the default target: the default configuration (token trees +
qfree) and plain sampling (``--method ar``), each with and without the mode, decoded side by side
in ONE process, interleaved (off, on, on, off, ... per prompt and repeat), same seed and prompts.

    PYTHONPATH=src OMP_NUM_THREADS=1 python benchmarks/invariant_speed.py \\
        [--dtype bf16] [--prompts 4] [--offset 0] [--repeats 3] [--tokens 96] [--seed 3] [--json FILE]

Prompts: HumanEval prompts offset .. offset + prompts - 1 (HumanEval 0-39 are held out: this only
measures). Each decoder is built once and warmed up on a prompt outside that range (the mode's row
shape is then probed or read from its disk cache before timing starts). Reported per configuration:
tokens/s (median over the runs), and the ratio with / without the mode per (prompt, repeat) pair:
median and range. Also: how many of the mode's default texts equal its ``--method ar`` texts.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

import torch

from verispec.bench.datasets import humaneval_prompts
from verispec.engine.decoder import SpeculativeDecoder
from verispec.models.default import encode_prompt, load_default_target

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
TEMPERATURE = 0.8


def decoders(model, tokenizer, args) -> dict[tuple[str, bool], SpeculativeDecoder]:
    """(method, invariant) -> decoder, each with its own target adapter (its own cache and row shape)."""
    common = dict(tokenizer=tokenizer, temperature=TEMPERATURE, max_new_tokens=args.tokens, eos_token_id=[], seed=args.seed)
    return {(method, invariant): SpeculativeDecoder(model, None, method=None if method == "default" else "ar",
                                                    batch_invariant=invariant, **common)
            for method in ("default", "ar") for invariant in (False, True)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dtype", choices=list(DTYPES), default="bf16")
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--offset", type=int, default=0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=96)
    parser.add_argument("--seed", type=int, default=3)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    model, tokenizer = load_default_target(DTYPES[args.dtype])
    prompts = [encode_prompt(tokenizer, p.text) for p in humaneval_prompts(args.prompts, args.offset)]
    warm_up = encode_prompt(tokenizer, humaneval_prompts(1, 100)[0].text)
    runs = decoders(model, tokenizer, args)
    for decoder in runs.values():
        decoder.generate(warm_up)
    print(f"row shape: {runs[('default', True)].row_shape}", flush=True)
    seconds = {key: [] for key in runs}
    texts = {key: {} for key in runs}
    tokens = {key: [] for key in runs}
    for repeat in range(args.repeats):
        for index, ids in enumerate(prompts):
            for method in ("default", "ar"):
                order = (False, True) if (repeat + index) % 2 == 0 else (True, False)
                for invariant in order:
                    output = runs[(method, invariant)].generate(ids)
                    seconds[(method, invariant)].append(output.seconds)
                    tokens[(method, invariant)].append(output.new_tokens)
                    texts[(method, invariant)][index] = output.token_ids
            print(f"repeat {repeat} prompt {index}: " + ", ".join(
                f"{m}{' inv' if inv else ''} {seconds[(m, inv)][-1]:.2f}s" for m, inv in runs), flush=True)
    rows = []
    print(f"\n{args.dtype}, {torch.get_num_threads()} thread(s), {platform.processor() or platform.machine()}, "
          f"{args.prompts} prompts x {args.repeats} repeats x {args.tokens} tokens, interleaved")
    print("| method | tokens/s off | tokens/s on | on/off time ratio: median | min | max |")
    print("|---|---|---|---|---|---|")
    for method in ("default", "ar"):
        off, on = seconds[(method, False)], seconds[(method, True)]
        ratios = [b / a for a, b in zip(off, on)]
        speed = {inv: statistics.median(t / s for t, s in zip(tokens[(method, inv)], seconds[(method, inv)])) for inv in (False, True)}
        rows.append({"method": method, "tokens_per_second_off": speed[False], "tokens_per_second_on": speed[True],
                     "time_ratio_median": statistics.median(ratios), "time_ratio_min": min(ratios), "time_ratio_max": max(ratios)})
        print(f"| {method} | {speed[False]:.1f} | {speed[True]:.1f} | {statistics.median(ratios):.3f} | {min(ratios):.3f} | {max(ratios):.3f} |")
    same_on = sum(texts[("default", True)][i] == texts[("ar", True)][i] for i in range(len(prompts)))
    same_off = sum(texts[("default", False)][i] == texts[("ar", False)][i] for i in range(len(prompts)))
    print(f"default text == ar text: {same_on}/{len(prompts)} with the mode, {same_off}/{len(prompts)} without")
    meta = {"args": {k: str(v) for k, v in vars(args).items()}, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "cpu": platform.processor() or platform.machine(), "threads": torch.get_num_threads()}
    if args.json:
        args.json.write_text(json.dumps({"meta": meta, "rows": rows, "seconds": {f"{m}/{i}": s for (m, i), s in seconds.items()}}, indent=1))


if __name__ == "__main__":
    main()
