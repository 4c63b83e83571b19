"""Decoding speed with the native runner's weights packed for oneDNN against ``F.linear`` on the
module weights, for plain decoding and the default token trees, side by side in one process.

    PYTHONPATH=src OMP_NUM_THREADS=1 python benchmarks/prepack_speed.py [--dtype fp32] [--humaneval 6]
        [--per-category 2] [--tokens 64] [--temperature 0] [--repeats 2]

Four decoders over one default target (one adapter each, built once): plain (``--method ar``) and
the default, each on a packed and on an unpacked runner. Per held-out prompt (HumanEval 0..N-1 and
the first ``--per-category`` held-out Spec-Bench prompts of translation, summarization, qa,
math_reasoning and rag), every decoder generates ``--tokens`` tokens (EOS ignored) ``--repeats``
times, in an order that reverses between repeats and prompts (A B C D D C B A ...). Printed: each
run's tokens per second (prefill included); per pair of configurations the geometric mean, min and
max over prompts x repeats of the ratio; how many plain texts are equal packed and unpacked.
"""

from __future__ import annotations

import argparse
import statistics

import torch

from robustness import SPEC_BENCH, geometric_mean, held_out_prompts
from verispec.cli.generate import DTYPES
from verispec.distill.data import default_spec_bench_path
from verispec.engine.decoder import SpeculativeDecoder
from verispec.models.default import encode_prompt, load_default_target
from verispec.models.hf import HFModelAdapter
from verispec.models.native_llama import NativeLlamaRunner, _can_prepack

CATEGORIES = ("translation", "summarization", "qa", "math_reasoning", "rag")
PAIRS = (
    ("plain, packed / unpacked", ("packed", "plain"), ("unpacked", "plain")),
    ("default, packed / unpacked", ("packed", "default"), ("unpacked", "default")),
    ("unpacked: default / plain", ("unpacked", "default"), ("unpacked", "plain")),
    ("packed: default / plain", ("packed", "default"), ("packed", "plain")),
    ("packed default / unpacked plain", ("packed", "default"), ("unpacked", "plain")),
)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dtype", default="fp32", choices=list(DTYPES))
    parser.add_argument("--humaneval", type=int, default=6)
    parser.add_argument("--per-category", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args(argv)
    dtype = DTYPES[args.dtype]
    if not _can_prepack(dtype, torch.device("cpu")):
        parser.error(f"this torch build cannot pack {args.dtype} weights for oneDNN; nothing to compare")
    model, tokenizer = load_default_target(dtype)
    prompts = held_out_prompts(None, args.per_category, default_spec_bench_path() or SPEC_BENCH, CATEGORIES, args.humaneval)

    def decoder(packed: bool, method: str | None) -> SpeculativeDecoder:
        adapter = HFModelAdapter(model, runner=NativeLlamaRunner(model, prepack=packed))
        extra = {} if method is None else {"method": method}
        return SpeculativeDecoder(adapter, tokenizer=tokenizer, temperature=args.temperature, max_new_tokens=args.tokens,
                                  eos_token_id=[], **extra)

    decoders = {}
    for kind in ("unpacked", "packed"):
        decoders[(kind, "plain")] = decoder(kind == "packed", "ar")
        decoders[(kind, "default")] = decoder(kind == "packed", None)
    names = list(decoders)
    rates: dict[tuple, list[float]] = {name: [] for name in names}
    equal_plain = 0
    print(f"{args.dtype}, {torch.get_num_threads()} thread(s), {args.tokens} tokens, T = {args.temperature}, {len(prompts)} prompts")
    for index, prompt in enumerate(prompts):
        ids = encode_prompt(tokenizer, prompt.text)
        texts = {}
        for repeat in range(args.repeats):
            order = names if (index + repeat) % 2 == 0 else names[::-1]
            for name in order:
                decoders[name].seed = index
                output = decoders[name].generate(ids)
                texts[name] = output.token_ids
                rates[name].append(output.new_tokens / output.seconds)
        equal_plain += texts[("packed", "plain")] == texts[("unpacked", "plain")]
        print(f"  {prompt.prompt_id:<14} " + "  ".join(f"{k} {m} {statistics.fmean(rates[(k, m)][-args.repeats:]):6.1f} tok/s" for k, m in names))
    for label, a, b in PAIRS:
        ratios = [x / y for x, y in zip(rates[a], rates[b])]
        print(f"{label:<34} geometric mean {geometric_mean(ratios):.3f}  min {min(ratios):.3f}  max {max(ratios):.3f}")
    print(f"plain texts equal packed and unpacked: {equal_plain} of {len(prompts)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
