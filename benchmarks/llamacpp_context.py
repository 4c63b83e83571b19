"""Which llama.cpp context parameter makes a one-token ``llama_decode`` slower (docs/llamacpp.md,
"Context parameters").

Usage:
    OMP_NUM_THREADS=1 python benchmarks/llamacpp_context.py [--context 300] [--steps 32]
        [--repeats 5] [--variants all]

One model (the default target's Q4_1 GGUF), one llama.cpp context per variant, 1 thread. Each
context prefills the same --context token prompt, then a round of --steps one-token decodes
(sequence 0, positions after the prompt; logits of the token), then removes those cells again, so
every round sees the same cache. Rounds are interleaved (A B C ..., rotated per repeat); printed:
the median ms per one-token ``llama_decode`` of each variant, relative to the adapter's own
parameters, with the min..max of that ratio over the repeats. Then the prefill of the prompt
(median ms, same interleaving).

Variants (each changes ONE thing from "ours", the parameters ``LlamaCppAdapter`` sets, unless
named "anchor", llama-cpp-python's ``Llama(n_ctx=4096)`` parameters):
    ours              what LlamaCppAdapter sets
    seq1              n_seq_max 1 (n_outputs_max as ours)
    seq8              n_seq_max 8
    ctx4096           n_ctx 4096
    no-unified        kv_unified False (needs n_seq_max 1: per-sequence caches otherwise)
    no-swa-full       swa_full False
    outputs0          n_outputs_max 0 (llama.cpp's default: n_batch)
    no-flash          flash attention off
    anchor            Llama(n_ctx=4096)'s parameters: flash off, n_seq_max 1, not unified
Nothing here is a held-out prompt: the prompt is a fixed code text repeated.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

PROMPT_TEXT = "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n"


def context_params(lib, name: str, adapter):
    """llama.cpp context parameters of variant ``name``, starting from the adapter's."""
    params = lib.llama_context_default_params()
    if name == "anchor":  # Llama(n_ctx=4096, n_threads=1): its __init__'s settings over the defaults
        params.n_ctx = 4096
        params.n_batch = params.n_ubatch = 512
        params.flash_attn_type = lib.LLAMA_FLASH_ATTN_TYPE_DISABLED
    else:
        adapter.settings.fill(lib, params)
        changes = {
            "seq1": dict(n_seq_max=1), "seq8": dict(n_seq_max=8), "ctx4096": dict(n_ctx=4096),
            "no-unified": dict(kv_unified=False, n_seq_max=1), "no-swa-full": dict(swa_full=False),
            "outputs0": dict(n_outputs_max=0), "no-flash": dict(flash_attn_type=lib.LLAMA_FLASH_ATTN_TYPE_DISABLED),
            "ours": {},
        }[name]
        for key, value in changes.items():
            setattr(params, key, value)
    params.n_threads = params.n_threads_batch = 1
    params.no_perf = True
    return params


class Runner:
    """One context of one variant: prefill once, then timed rounds of one-token decodes."""

    def __init__(self, lib, model, params, prompt: list[int], vocab: int):
        self.lib, self.prompt, self.vocab = lib, prompt, vocab
        self.ctx = lib.llama_init_from_model(model, params)
        if not self.ctx:
            raise RuntimeError("llama.cpp refused the context")
        self.memory = lib.llama_get_memory(self.ctx)
        self.batch = lib.llama_batch_init(512, 0, 1)

    def _fill(self, tokens, start: int, last_logits: bool) -> None:
        batch = self.batch
        for j, token in enumerate(tokens):
            batch.token[j] = token
            batch.pos[j] = start + j
            batch.n_seq_id[j] = 1
            batch.seq_id[j][0] = 0
            batch.logits[j] = last_logits and j == len(tokens) - 1
        batch.n_tokens = len(tokens)

    def prefill(self) -> float:
        """Seconds of the prompt's prefill (all but its last token) into a cleared cache."""
        self.lib.llama_memory_clear(self.memory, True)
        body = self.prompt[:-1]
        tic = time.perf_counter()
        for start in range(0, len(body), 512):
            self._fill(body[start : start + 512], start, False)
            assert self.lib.llama_decode(self.ctx, self.batch) == 0
        return time.perf_counter() - tic

    def steps(self, n: int) -> float:
        """Median seconds of one one-token llama_decode over n steps after the prompt (then removed)."""
        token, length, times = self.prompt[-1], len(self.prompt) - 1, []
        for i in range(n):
            self._fill([token], length + i, True)
            tic = time.perf_counter()
            assert self.lib.llama_decode(self.ctx, self.batch) == 0
            times.append(time.perf_counter() - tic)
            logits = self.lib.llama_get_logits(self.ctx)
            token = max(range(0, 64), key=lambda k: logits[k])  # cheap, deterministic next token
        self.lib.llama_memory_seq_rm(self.memory, 0, length, -1)
        return statistics.median(times)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--context", type=int, default=300)
    parser.add_argument("--steps", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--variants", default="ours,seq1,seq8,ctx4096,no-unified,no-swa-full,outputs0,no-flash,anchor")
    args = parser.parse_args(argv)

    from verispec.models.default import encode_prompt, load_default_tokenizer
    from verispec.models.llamacpp import load_llamacpp_adapter

    adapter = load_llamacpp_adapter("default", n_threads=1)
    lib, model = adapter._llama, adapter._model
    ids = encode_prompt(load_default_tokenizer(), PROMPT_TEXT * 40)[: args.context]
    names = args.variants.split(",")
    runners = {name: Runner(lib, model, context_params(lib, name, adapter), ids, adapter.vocab_size) for name in names}
    step_ms = {name: [] for name in names}
    prefill_ms = {name: [] for name in names}
    for repeat in range(args.repeats):
        order = names[repeat % len(names):] + names[: repeat % len(names)]
        for name in order:
            prefill_ms[name].append(1e3 * runners[name].prefill())
            step_ms[name].append(1e3 * runners[name].steps(args.steps))
        print(f"repeat {repeat}: " + "  ".join(f"{n} {step_ms[n][-1]:.2f}" for n in names), flush=True)
    base = step_ms["ours"] if "ours" in step_ms else step_ms[names[0]]
    print(f"\none-token llama_decode after {len(ids) - 1} cached tokens, 1 thread, median of {args.steps} steps x {args.repeats} interleaved repeats")
    print("| variant | ms / step | vs ours (min..max over repeats) | prefill ms |")
    print("|---|---|---|---|")
    for name in names:
        ratios = [a / b for a, b in zip(step_ms[name], base)]
        print(f"| {name} | {statistics.median(step_ms[name]):.2f} | {statistics.median(ratios):.3f} "
              f"({min(ratios):.3f}..{max(ratios):.3f}) | {statistics.median(prefill_ms[name]):.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
