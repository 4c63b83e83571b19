"""One query row's attention: torch's flash kernel against two float32 products (models.attention),
per kernel and end to end, side by side in one process.

    PYTHONPATH=src OMP_NUM_THREADS=1 python benchmarks/single_query_attention.py [--dtype bf16]
        [--contexts 50,200,600,2000] [--humaneval 6] [--per-category 2] [--tokens 64] [--repeats 2]
    PYTHONPATH=src OMP_NUM_THREADS=1 python benchmarks/single_query_attention.py --curve [--context 300]

Kernel: for each context length, the median of 200 calls of one layer's attention of the default
target's shape (9 query heads over 3 kv heads, head dim 64) for one query row, through
``scaled_dot_product_attention`` and through ``single_query_attention``; the same flash call with 2
rows for comparison; and the largest difference of each from a float64 result.

Curve (--curve, instead of the two above): the default target's runner forward over n = 1, 2, 3,
5, 9, 16, 24, 32 new tokens in a random tree (each node under its predecessor or a random earlier
node) after ``--context`` cached tokens, with the path on and off, the sizes and the two settings
shuffled in every one of ``--repeats`` passes; printed: the median seconds relative to one token
with the path on (the shape of ``draft.tree_policy.DEFAULT_COST_POINTS``).

End to end: four decoders over one default target, plain (``--method ar``) and the default, each
with the runner's ``single_query_path`` on and off; off, the default keeps the cost prior shipped
with the flash kernel (``FLASH_KERNEL_PRIOR``), so "off" is the code as it was before the path. Per held-out prompt (HumanEval 0..N-1 and the
first ``--per-category`` held-out Spec-Bench prompts of five categories) each generates
``--tokens`` tokens (EOS ignored) ``--repeats`` times, the order reversing between repeats and
prompts (A B C D D C B A ...). Printed: per pair the geometric mean, min and max over prompts x
repeats of the ratio of tokens per second (prefill included).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

from robustness import SPEC_BENCH, geometric_mean, held_out_prompts
from verispec.cli.generate import DTYPES
from verispec.distill.data import default_spec_bench_path
from verispec.engine.cost_model import OnlineCostModel
from verispec.engine.decoder import SpeculativeDecoder
from verispec.models.attention import single_query_attention
from verispec.models.default import encode_prompt, fast_dtype_name, load_default_target
from verispec.models.hf import HFModelAdapter
from verispec.models.native_llama import NativeLlamaRunner

CATEGORIES = ("translation", "summarization", "qa", "math_reasoning", "rag")
# the shipped cost prior while one-token forwards took the flash kernel (5 tokens cost 1.03x one)
FLASH_KERNEL_PRIOR = ((1, 1.0), (5, 1.03), (9, 1.16), (16, 1.35), (24, 1.59), (32, 1.91))
PAIRS = (
    ("plain, products / flash", ("on", "plain"), ("off", "plain")),
    ("default, products / flash", ("on", "default"), ("off", "default")),
    ("flash: default / plain", ("off", "default"), ("off", "plain")),
    ("products: default / plain", ("on", "default"), ("on", "plain")),
)


def median_us(call, calls: int = 200) -> float:
    for _ in range(5):
        call()
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e6


def kernel_table(dtype: torch.dtype, contexts: list[int]) -> None:
    print(f"one layer's attention, 9 query heads / 3 kv heads / head dim 64, {dtype}, {torch.get_num_threads()} thread(s)")
    print("| cached keys | flash, 1 row (us) | float32 products, 1 row (us) | flash, 2 rows (us) | max error flash / products |")
    print("|---|---|---|---|---|")
    generator = torch.Generator().manual_seed(0)
    for keys in contexts:
        cache_k = (torch.randn(1, 3, keys + 64, 64, generator=generator) * 2).to(dtype)
        cache_v = torch.randn(1, 3, keys + 64, 64, generator=generator).to(dtype)
        k, v = cache_k[:, :, :keys], cache_v[:, :, :keys]
        query = (torch.randn(1, 9, 1, 64, generator=generator) * 2).to(dtype)
        rows2 = (torch.randn(1, 9, 2, 64, generator=generator) * 2).to(dtype)
        exact = F.scaled_dot_product_attention(query.double(), k.double(), v.double(), scale=0.125, enable_gqa=True)
        flash = lambda: F.scaled_dot_product_attention(query, k, v, scale=0.125, enable_gqa=True)  # noqa: E731
        products = lambda: single_query_attention(query, k, v, 0.125)  # noqa: E731
        errors = [(f().double() - exact).abs().max().item() for f in (flash, products)]
        print(f"| {keys} | {median_us(flash):.0f} | {median_us(products):.0f} | "
              f"{median_us(lambda: F.scaled_dot_product_attention(rows2, k, v, scale=0.125, enable_gqa=True)):.0f} | "
              f"{errors[0]:.1e} / {errors[1]:.1e} |")


def cost_curve(dtype: torch.dtype, context: int, repeats: int) -> None:
    import random

    from verispec.models.hf import tree_attention_mask

    model, _ = load_default_target(dtype)
    runner = NativeLlamaRunner(model)
    chooser = random.Random(0)
    runner.forward([chooser.randrange(1000, 20000) for _ in range(context)], list(range(context)), None, keep=1)
    sizes = (1, 2, 3, 5, 9, 16, 24, 32)
    times: dict[tuple[bool, int], list[float]] = {(path, n): [] for path in (True, False) for n in sizes}
    for _ in range(repeats):
        for n in chooser.sample(sizes, len(sizes)):
            parents = [-1] + [i - 1 if chooser.random() < 0.5 else chooser.randrange(i) for i in range(1, n)]
            ancestors = []
            for node in range(n):
                path = [node]
                while parents[path[-1]] >= 0:
                    path.append(parents[path[-1]])
                ancestors.append(path[::-1])
            allowed = tree_attention_mask(context, 0, ancestors, n) if n > 1 else None
            positions = [context + len(path) - 1 for path in ancestors]
            tokens = [chooser.randrange(1000, 20000) for _ in range(n)]
            for path in chooser.sample((True, False), 2):
                runner.single_query_path = path
                start = time.perf_counter()
                runner.forward(tokens, positions, allowed, keep=n)
                times[(path, n)].append(time.perf_counter() - start)
                runner.keep_entries(context)
    unit = statistics.median(times[(True, 1)])
    print(f"forward over n tree nodes after {context} cached tokens, {dtype}, {torch.get_num_threads()} thread(s), "
          f"{repeats} passes; one token with the path: {unit * 1e3:.1f} ms")
    print("| n | float32 products for one row | flash kernel for one row |")
    print("|---|---|---|")
    for n in sizes:
        print(f"| {n} | {statistics.median(times[(True, n)]) / unit:.3f} | {statistics.median(times[(False, n)]) / unit:.3f} |")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dtype", default="auto", choices=["auto", *DTYPES])
    parser.add_argument("--contexts", default="50,200,600,2000")
    parser.add_argument("--humaneval", type=int, default=6)
    parser.add_argument("--per-category", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--curve", action="store_true", help="time forwards over 1-32 tree nodes instead")
    parser.add_argument("--context", type=int, default=300, help="--curve: cached tokens before the tree")
    args = parser.parse_args(argv)
    dtype = DTYPES[fast_dtype_name() if args.dtype == "auto" else args.dtype]
    if args.curve:
        cost_curve(dtype, args.context, max(args.repeats, 12))
        return 0
    kernel_table(dtype, [int(c) for c in args.contexts.split(",")])
    if args.humaneval + args.per_category == 0:
        return 0
    model, tokenizer = load_default_target(dtype)
    prompts = held_out_prompts(None, args.per_category, default_spec_bench_path() or SPEC_BENCH, CATEGORIES, args.humaneval)

    def decoder(path: bool, method: str | None) -> SpeculativeDecoder:
        runner = NativeLlamaRunner(model)
        runner.single_query_path = path
        extra = {} if method is None else {"method": method}
        # without the path, the cost prior of that time too: the code as it was before the path
        prior = None if path else OnlineCostModel(prior_points=FLASH_KERNEL_PRIOR)
        return SpeculativeDecoder(HFModelAdapter(model, runner=runner), tokenizer=tokenizer, temperature=args.temperature,
                                  max_new_tokens=args.tokens, eos_token_id=[], cost_model=prior, **extra)

    decoders = {(state, kind): decoder(state == "on", "ar" if kind == "plain" else None)
                for state in ("off", "on") for kind in ("plain", "default")}
    names = list(decoders)
    rates: dict[tuple, list[float]] = {name: [] for name in names}
    print(f"\nend to end: {dtype}, {torch.get_num_threads()} thread(s), {args.tokens} tokens, T = {args.temperature}, "
          f"{len(prompts)} prompts x {args.repeats} repeats")
    for index, prompt in enumerate(prompts):
        ids = encode_prompt(tokenizer, prompt.text)
        for repeat in range(args.repeats):
            for name in (names if (index + repeat) % 2 == 0 else names[::-1]):
                decoders[name].seed = index
                output = decoders[name].generate(ids)
                rates[name].append(output.new_tokens / output.seconds)
        print(f"  {prompt.prompt_id}: " + ", ".join(f"{s} {k} {statistics.mean(rates[(s, k)][-args.repeats:]):.1f} tok/s"
                                                  for s, k in names), flush=True)
    print("| pair | geometric mean | min | max |")
    print("|---|---|---|---|")
    for label, a, b in PAIRS:
        ratios = [x / y for x, y in zip(rates[a], rates[b])]
        print(f"| {label} | {geometric_mean(ratios):.3f} | {min(ratios):.3f} | {max(ratios):.3f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
