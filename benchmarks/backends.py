"""torch vs llama.cpp as the engine's backend, on the default target (docs/llamacpp.md).

Usage:
    python benchmarks/backends.py [--dataset humaneval,specbench] [--start 0] [--limit 4]
        [--per-category 1] [--max-new-tokens 32] [--threads 1,2] [--repeats 1]
        [--dtypes auto,fp32] [--context 300] [--json OUT.json]

One process; the default target loaded once per torch dtype (the de-quantized safetensors, the
native runner; --dtypes, "auto" = this CPU's fast dtype, duplicates dropped) and once on llama.cpp
(the shipped Q4_1 GGUF itself, ``LlamaCppAdapter``). For every thread count and prompt, the
configurations run back to back, their order rotated between prompts and repeats and reversed
every other prompt (A B C D E, A E D C B, C D E A B, ...), greedy, exactly --max-new-tokens tokens (EOS ignored):
    torch DTYPE plain    SpeculativeDecoder(method="ar") on torch in DTYPE
    torch DTYPE default  SpeculativeDecoder(target): token trees + q-free, on torch in DTYPE
    llamacpp plain    SpeculativeDecoder(method="ar") on llama.cpp
    llamacpp default  SpeculativeDecoder(target): token trees + q-free, on llama.cpp
    llama-cpp-python  its own high-level ``Llama.generate`` (greedy), the anchor for plain decoding
The token-tree drafters measure their target's cost curve on a warm-up prompt first.

Prompts (--dataset, comma-separated): HumanEval --start.. (--limit of them) and the everyday
Spec-Bench prompts (--per-category per category, ids divisible by 5).

Then the cost curve of each backend: one forward over n = 1, 2, 4, 8, 16 tokens (a chain below
the root) after a --context token prompt, median of --curve-repeats interleaved rounds, in ms and
relative to n = 1; and the prefill of that prompt on llama.cpp with the adapter's prefill batch
(PREFILL_BATCH) against batches of BATCH_INVARIANT_TOKENS and against llama-cpp-python's own
``Llama.eval``, interleaved, median.

Held-out data: HumanEval 0-39 and Spec-Bench ids divisible by 5 are for evaluation only.

Printed: tokens/s of each configuration per thread count (total tokens / total seconds, prefill
included; and decoding alone: one-token forwards after the prefill, the anchor's first token being
part of its prefill, as ours is part of the first round), the
per-prompt spread (min..max) of the ratios, block efficiency of the speculative ones, and whether
our plain llama.cpp decoding produced the anchor's tokens.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from draft_compare import load_prompts  # noqa: E402  (one definition of the held-out prompt choice)

LLAMA_CONFIGS = ("llamacpp plain", "llamacpp default", "llama-cpp-python")
CURVE_SIZES = (1, 2, 4, 8, 16)


def open_anchor(gguf, n_threads: int):
    """llama-cpp-python's own ``Llama`` on the GGUF, with llama.cpp's extra weight buffers set as
    our adapter sets them (``Llama`` has no flag for it; with AMX they crash llama.cpp here)."""
    from llama_cpp import Llama
    from llama_cpp import llama_cpp as low

    from verispec.models.llamacpp import default_extra_buffers

    original = low.llama_model_default_params

    def params():
        chosen = original()
        chosen.use_extra_bufts = default_extra_buffers(low)
        return chosen

    low.llama_model_default_params = params
    try:
        return Llama(str(gguf), n_ctx=4096, n_threads=n_threads, n_threads_batch=n_threads, verbose=False)
    finally:
        low.llama_model_default_params = original


def anchor_generate(llama, ids: list[int], max_new_tokens: int) -> tuple[list[int], float]:
    """llama-cpp-python's own greedy generation (``Llama.generate``, temperature 0): (tokens,
    seconds from the first token to the last, i.e. the len - 1 one-token forwards after the prefill)."""
    out, first = [], None
    for token in llama.generate(ids, temp=0.0, top_k=1, top_p=1.0, min_p=0.0, repeat_penalty=1.0, reset=True):
        out.append(int(token))
        first = time.perf_counter() if first is None else first
        if len(out) >= max_new_tokens:
            break
    return out, time.perf_counter() - first


def cost_curve(adapter, prompt: list[int], repeats: int) -> dict[int, float]:
    """Median seconds of one forward over n tokens below the root after ``prompt``, per n."""
    adapter.reset(prompt)
    root = adapter.tokens()[-1]
    times: dict[int, list[float]] = {n: [] for n in CURVE_SIZES}
    for _ in range(repeats):
        for n in CURVE_SIZES:
            tic = time.perf_counter()
            adapter.score([-1] + [root] * (n - 1), list(range(-1, n - 1)))
            times[n].append(time.perf_counter() - tic)
    adapter.rollback()
    return {n: statistics.median(values) for n, values in times.items()}


def prefill_times(gguf, prompt: list[int], n_threads: int, repeats: int) -> dict[str, float]:
    """Median seconds of the prefill of ``prompt`` (all but its last token, as ``reset`` does):
    our adapter with its prefill batch, with batches of BATCH_INVARIANT_TOKENS (the earlier
    default), and llama-cpp-python's ``Llama.eval`` (its default n_batch 512), interleaved."""
    from verispec.models.llamacpp import BATCH_INVARIANT_TOKENS, PREFILL_BATCH, LlamaCppAdapter

    runners = {
        f"ours, prefill batch {PREFILL_BATCH}": LlamaCppAdapter(gguf, n_threads=n_threads).reset,
        f"ours, prefill batch {BATCH_INVARIANT_TOKENS}": LlamaCppAdapter(gguf, n_threads=n_threads, prefill_batch=BATCH_INVARIANT_TOKENS).reset,
    }
    anchor = open_anchor(gguf, n_threads)

    def anchor_prefill(ids):
        anchor.reset()
        anchor.eval(ids[:-1])

    runners["llama-cpp-python Llama.eval"] = anchor_prefill
    times: dict[str, list[float]] = {name: [] for name in runners}
    for _ in range(repeats):
        for name, run in runners.items():
            tic = time.perf_counter()
            run(prompt)
            times[name].append(time.perf_counter() - tic)
    return {name: statistics.median(values) for name, values in times.items()}


def load_all_prompts(args, tokenizer, encode_prompt) -> list[tuple[str, list[int]]]:
    """(id, token ids) of every --dataset's prompts."""
    prompts = []
    for dataset in args.dataset.split(","):
        chosen = argparse.Namespace(**{**vars(args), "dataset": dataset.strip()})
        prompts += [(pid, encode_prompt(tokenizer, text)) for pid, _, text in load_prompts(chosen)]
    return prompts


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dataset", default="humaneval", help="humaneval, specbench or both, comma-separated")
    parser.add_argument("--spec-bench", default="/work/shared/data/spec_bench/question.jsonl")
    parser.add_argument("--start", type=int, default=0)
    parser.add_argument("--limit", type=int, default=4)
    parser.add_argument("--per-category", type=int, default=1)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--dtypes", default="auto,fp32", help="torch dtypes, comma-separated: auto, fp32, bf16")
    parser.add_argument("--context", type=int, default=300, help="prompt length of the cost curve")
    parser.add_argument("--curve-repeats", type=int, default=5)
    parser.add_argument("--tuning", action="store_true",
                        help="Spec-Bench ids NOT divisible by 5 (tuning prompts; pair with --start 40 for HumanEval)")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)

    from verispec.cli.generate import resolve_dtype
    from verispec.engine.decoder import SpeculativeDecoder
    from verispec.models.default import encode_prompt, fast_dtype_name, load_default_target
    from verispec.models.hf import HFModelAdapter
    from verispec.models.llamacpp import gguf_of_target, load_llamacpp_adapter

    dtype_names = list(dict.fromkeys(fast_dtype_name() if d.strip() == "auto" else d.strip() for d in args.dtypes.split(",")))
    common = dict(temperature=0, max_new_tokens=args.max_new_tokens, eos_token_id=[])
    decoders, torch_targets = {}, {}
    for dtype_name in dtype_names:
        model, tokenizer = load_default_target(resolve_dtype(dtype_name))
        torch_targets[dtype_name] = HFModelAdapter(model)
        decoders[f"torch {dtype_name} plain"] = SpeculativeDecoder(torch_targets[dtype_name], None, method="ar", **common)
        decoders[f"torch {dtype_name} default"] = SpeculativeDecoder(torch_targets[dtype_name], None, **common)
    llama_target = load_llamacpp_adapter("default", n_threads=1)
    gguf = gguf_of_target("default")
    decoders["llamacpp plain"] = SpeculativeDecoder(llama_target, None, method="ar", **common)
    decoders["llamacpp default"] = SpeculativeDecoder(llama_target, None, **common)
    CONFIGS = tuple(decoders) + ("llama-cpp-python",)
    prompts = load_all_prompts(args, tokenizer, encode_prompt)
    threads = [int(t) for t in args.threads.split(",")]
    warm = encode_prompt(tokenizer, "Write a function that adds two numbers.")
    results: dict = {"machine": platform.processor() or platform.machine(), "dtypes": dtype_names,
                     "gguf": gguf.name, "max_new_tokens": args.max_new_tokens, "threads": {},
                     "started": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    for n_threads in threads:
        torch.set_num_threads(n_threads)
        llama_target.set_threads(n_threads)
        anchor = open_anchor(gguf, n_threads)
        for decoder in decoders.values():  # warm-up; the tree drafters measure their cost curves here
            decoder.generate(warm)
        anchor_generate(anchor, warm, 4)
        per_prompt: list[dict] = []
        for repeat in range(args.repeats):
            for index, (pid, ids) in enumerate(prompts):
                shift = (index + repeat) % len(CONFIGS)
                row: dict = {"prompt": pid, "prompt_tokens": len(ids)}
                order = CONFIGS[shift:] + CONFIGS[:shift]
                # reversed every other prompt: a pure rotation keeps each configuration's
                # predecessor fixed (llama.cpp default always right after llama.cpp plain)
                for name in order if (index + repeat) % 2 == 0 else order[::-1]:
                    tic = time.perf_counter()
                    if name == "llama-cpp-python":
                        tokens, decode = anchor_generate(anchor, ids, args.max_new_tokens)
                        row[name] = {"tokens": len(tokens), "seconds": time.perf_counter() - tic, "ids": tokens,
                                     "decode_rate": (len(tokens) - 1) / decode}
                    else:
                        out = decoders[name].generate(ids)
                        # after the prefill of prompt[:-1], every token costs rounds (the first
                        # round's forward includes the last prompt token, as the anchor's prefill does)
                        row[name] = {"tokens": out.new_tokens, "seconds": time.perf_counter() - tic,
                                     "be": out.block_efficiency, "ids": out.token_ids,
                                     "decode_rate": out.new_tokens / (out.seconds - out.prefill_seconds)}
                per_prompt.append(row)
        del anchor
        totals = {name: sum(r[name]["tokens"] for r in per_prompt) / sum(r[name]["seconds"] for r in per_prompt) for name in CONFIGS}

        def spread(a: str, b: str) -> tuple[float, float]:
            ratios = [(r[a]["tokens"] / r[a]["seconds"]) / (r[b]["tokens"] / r[b]["seconds"]) for r in per_prompt]
            return min(ratios), max(ratios)

        def decode_spread(a: str, b: str) -> tuple[float, float]:
            ratios = [r[a]["decode_rate"] / r[b]["decode_rate"] for r in per_prompt]
            return min(ratios), max(ratios)

        decode = {name: statistics.mean(r[name]["decode_rate"] for r in per_prompt) for name in CONFIGS}
        same = sum(r["llamacpp plain"]["ids"] == r["llama-cpp-python"]["ids"] for r in per_prompt)
        pairs = [("llamacpp plain", "llama-cpp-python"), ("llamacpp default", "llamacpp plain")]
        for dtype_name in dtype_names:
            pairs += [("llamacpp plain", f"torch {dtype_name} plain"), ("llamacpp default", f"torch {dtype_name} default"),
                      (f"torch {dtype_name} default", f"torch {dtype_name} plain")]
        speculative = [name for name in CONFIGS if name.endswith("default")]
        summary = {
            "tokens_per_second": totals,
            "decode_tokens_per_second": decode,
            "block_efficiency": {name: statistics.mean(r[name]["be"] for r in per_prompt) for name in speculative},
            "ratios": {f"{a} / {b}": (totals[a] / totals[b], spread(a, b)) for a, b in pairs},
            "decode_ratios": {f"{a} / {b}": (decode[a] / decode[b], decode_spread(a, b)) for a, b in pairs},
            "plain_equals_anchor": f"{same}/{len(per_prompt)}",
            "per_prompt": [{k: ({kk: vv for kk, vv in v.items() if kk != "ids"} if isinstance(v, dict) else v) for k, v in r.items()} for r in per_prompt],
        }
        long_prompt = (prompts[0][1] * (args.context // len(prompts[0][1]) + 1))[: args.context]
        curves = {}
        for name, adapter in [(f"torch {d}", t) for d, t in torch_targets.items()] + [("llamacpp", llama_target)]:
            curve = cost_curve(adapter, long_prompt, args.curve_repeats)
            curves[name] = {n: {"ms": 1e3 * s, "relative": s / curve[1]} for n, s in curve.items()}
        summary["cost_curve"] = curves
        prefill = prefill_times(gguf, long_prompt, n_threads, args.curve_repeats)
        summary["prefill_ms"] = {name: 1e3 * seconds for name, seconds in prefill.items()}
        results["threads"][n_threads] = summary

        print(f"\n== {n_threads} thread(s), {len(prompts)} prompts x {args.repeats}, {args.max_new_tokens} tokens, "
              f"torch {', '.join(dtype_names)}, llama.cpp {gguf.name}")
        for name in CONFIGS:
            be = summary["block_efficiency"].get(name)
            print(f"  {name:18s} {totals[name]:7.1f} tok/s with prefill, {decode[name]:7.1f} tok/s decoding"
                  + (f"   BE {be:.2f}" if be else ""))
        print("  ratios, with prefill | decoding only (per-prompt min..max):")
        for label, (ratio, (low, high)) in summary["ratios"].items():
            d_ratio, (d_low, d_high) = summary["decode_ratios"][label]
            print(f"    {label:40s} {ratio:5.2f}x ({low:.2f}..{high:.2f}) | {d_ratio:5.2f}x ({d_low:.2f}..{d_high:.2f})")
        print(f"  llamacpp plain tokens == llama-cpp-python's: {summary['plain_equals_anchor']} prompts")
        print(f"  cost curve at {args.context} tokens of context (ms, relative to n = 1):")
        for name, curve in curves.items():
            cells = "  ".join(f"n={n}: {c['ms']:.1f} ({c['relative']:.2f}x)" for n, c in curve.items())
            print(f"    {name:11s} {cells}")
        print(f"  prefill of {args.context - 1} tokens on llama.cpp (median of {args.curve_repeats}, ms): "
              + ", ".join(f"{name} {ms:.1f}" for name, ms in summary["prefill_ms"].items()))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
