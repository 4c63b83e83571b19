"""verispec's speculative sampling beside transformers' own assisted generation, same pair, one run.

Usage:
    python benchmarks/vs_transformers.py --target DIR --draft DIR [-L 4,8] [--temperatures 0,1]
        [--dataset humaneval|PATH] [--limit 5] [--max-new-tokens 64] [--seeds 0] [--dtype fp32]
    python benchmarks/vs_transformers.py --tiny        # tiny random Llama pair, no download

For every dataset x temperature x L x seed, on the same prompts and in the same process:
    hf generate    transformers model.generate() without a draft
    hf assisted    model.generate(assistant_model=draft) with num_assistant_tokens = L,
                   num_assistant_tokens_schedule = "constant", assistant_confidence_threshold = 0
                   (a fixed-length L draft; transformers' defaults would adapt L and stop drafting
                   below 0.4 confidence). Sampling verifies with token-wise speculative sampling.
    verispec ar    plain autoregressive sampling through verispec's KV-cached adapter
    verispec sd    SpeculativeDecoder(method="sd", K=1, L) with the same draft model
    sd [BACKEND]   verispec sd again with its adapters on another runner (--backends; default: also
                   ``transformers``, the models' own forward, to show how much of the ratio comes
                   from verispec's native Llama forward and how much from the rest of the engine)
It prints tokens/s of each, the block efficiency (tokens per target forward call; transformers'
calls counted with a forward hook) of the two speculative ones, and the ratio verispec sd
tokens/s / hf assisted tokens/s. The same rows appear in ``verispec bench --anchor --draft DIR``.

The default target has no neural draft yet, so --target/--draft name Hugging Face model
directories sharing one vocabulary; --tiny builds two random Llamas (2 layers / 1 layer, vocab 64)
with a character tokenizer, which shows the mechanics, not realistic speeds.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import torch

from verispec.bench.anchor import ANCHOR_COLUMNS, anchor_table
from verispec.bench.config import make_config
from verispec.bench.report import write_reports
from verispec.bench.runner import run_sweep

TINY_PROMPTS = [
    {"question_id": 1, "category": "writing", "turns": ["Write a short poem about the sea and the wind."]},
    {"question_id": 2, "category": "math", "turns": ["What is 17 times 23? Explain step by step."]},
    {"question_id": 3, "category": "coding", "turns": ["def fibonacci(n):\n    return"]},
]


class CharTokenizer:
    """Characters onto a small vocabulary, for the random --tiny models (no EOS)."""

    eos_token_id = None
    chat_template = None

    def __init__(self, vocab_size: int):
        self.vocab_size = vocab_size

    def encode(self, text, add_special_tokens=True):
        return [ord(c) % self.vocab_size for c in text[:48]]

    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(ord("!") + int(i) % 90) for i in ids)


def tiny_pair(vocab_size: int = 64):
    from transformers import LlamaConfig, LlamaForCausalLM

    def llama(seed, layers):
        torch.manual_seed(seed)
        config = LlamaConfig(vocab_size=vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
                             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512)
        config._attn_implementation = "sdpa"
        model = LlamaForCausalLM(config).eval()
        with torch.no_grad():
            model.lm_head.weight.mul_(2.0)
        return model

    return llama(0, 2), llama(1, 1), CharTokenizer(vocab_size)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", default=None, help="target model directory")
    parser.add_argument("--draft", default=None, help="draft model directory (shares the target's vocabulary)")
    parser.add_argument("--tiny", action="store_true", help="use a tiny random Llama pair instead")
    parser.add_argument("-L", "--draft-len", default="4")
    parser.add_argument("--temperatures", default="0,1")
    parser.add_argument("--dataset", default="humaneval")
    parser.add_argument("--limit", type=int, default=5)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--seeds", default="0")
    parser.add_argument("--dtype", default="fp32", choices=["fp32", "bf16", "fp16"])
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    parser.add_argument("--backends", default="auto,transformers",
                        help="verispec runners to measure, the first one beside transformers' runs "
                             "(auto = native Llama forward when possible; transformers = the model's own forward)")
    parser.add_argument("--json", default=None, help="also write the table rows to this file")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)

    work = Path(tempfile.mkdtemp(prefix="vs_transformers."))
    if args.tiny:
        target, draft, tokenizer = tiny_pair()
        dataset = work / "tiny_prompts.jsonl"
        dataset.write_text("\n".join(json.dumps(p) for p in TINY_PROMPTS) + "\n")
        dataset = str(dataset)
    else:
        if not (args.target and args.draft):
            parser.error("give --target DIR and --draft DIR (Hugging Face model directories), or --tiny")
        from verispec.cli.generate import DTYPES
        import verispec.models.default_draft  # noqa: F401  registers the distilled drafts' architecture
        from verispec.models.default import load_model

        target, tokenizer = load_model(args.target, DTYPES[args.dtype])
        draft, _ = load_model(args.draft, DTYPES[args.dtype])
        dataset = args.dataset
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    results = []
    for index, backend in enumerate(backends):  # transformers' runs once, with the first backend
        config = make_config(None, dict(
            methods="sd", dataset=[dataset], limit=args.limit, L=args.draft_len, temperatures=args.temperatures,
            max_new_tokens=args.max_new_tokens, seeds=args.seeds, out=str(work / backend), anchor=index == 0,
            dtype=args.dtype, target=args.target, draft=args.draft, backend=backend,
        ))
        results.append(run_sweep(config, target, tokenizer, draft))
        write_reports(config.out, results[-1].records, results[-1].rows, results[-1].skipped, results[-1].meta)
    result = results[0]
    table = anchor_table(result.rows, result.records)
    columns = list(ANCHOR_COLUMNS)
    for backend, extra in zip(backends[1:], results[1:]):
        # verispec's sd again, its adapters running the model through the other backend
        index = {(r.dataset, r.method, r.L, r.temperature): r for r in extra.rows if r.category == "all"}
        for entry in table:
            row = index.get((entry["dataset"], "sd", entry["L"], entry["temperature"]))
            entry[f"sd_{backend}_tps"] = row.tokens_per_second if row else float("nan")
            entry[f"sd_{backend}_over_hf_assisted"] = (row.tokens_per_second / entry["hf_assisted_tps"]) if row else float("nan")
        columns += [(f"sd_{backend}_tps", f"sd [{backend}] tok/s"), (f"sd_{backend}_over_hf_assisted", f"sd [{backend}] / hf assisted")]
    widths = [max(len(label), 12) for _, label in columns]
    backend_used = result.meta["backend"]
    print(f"target {result.meta['target']}, draft {result.meta['draft']}, {args.dtype}, "
          f"{result.meta['torch_threads']} threads, transformers {result.meta['transformers']}, "
          f"{args.max_new_tokens} new tokens, prompts per dataset: {len(result.datasets[0].prompts)}, "
          f"verispec runner: target {backend_used['target']}, draft {backend_used['draft']}")
    print("  ".join(label.rjust(width) for (_, label), width in zip(columns, widths)))
    for entry in table:
        cells = []
        for (key, _), width in zip(columns, widths):
            value = entry[key]
            text = value if isinstance(value, str) else (f"{value:g}" if key in ("temperature", "L") else f"{value:.2f}")
            if key.endswith("_be") and f"{key}_ci" in entry:
                text += f" ± {entry[key + '_ci']:.2f}"
            cells.append(text.rjust(width))
        print("  ".join(cells))
    print("tok/s pooled over prompts (new tokens / walltime of generate, prefill included); "
          "BE = new tokens / target forward calls, ± the 95 % interval half-width over prompts x seeds; "
          "ratio columns = verispec sd tok/s / hf assisted tok/s.")
    print(f"full bench reports (records.jsonl, summary.md, report.html), one folder per runner: {work}")
    if args.json:
        Path(args.json).write_text(json.dumps(table, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
