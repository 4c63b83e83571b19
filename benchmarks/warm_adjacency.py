"""The token-tree draft started from a learned adjacency table against an empty one.

    PYTHONPATH=src OMP_NUM_THREADS=1 python benchmarks/warm_adjacency.py --build TABLE.npz [--prompts-file FILE] [--limit N]
    PYTHONPATH=src OMP_NUM_THREADS=1 python benchmarks/warm_adjacency.py --table TABLE.npz \\
        [--humaneval 10] [--per-category 3] [--temperature 0] [--max-new-tokens 96] [--repeats 2]

``--build``: one default decoder (greedy, the default target) decodes every prompt of
``--prompts-file`` (a text file, one prompt a line, or Spec-Bench JSONL), or else the *training*
prompts (HumanEval 40-163, then Spec-Bench ids not divisible by 5, in file order;
``distill.data.split_prompts("train")``), the first ``--limit`` of them, for ``--max-new-tokens``
tokens each, and its adjacency table (the target's top-8 next tokens after every token it scored,
the last row seen winning) is written with ``AdjacencyTable.save`` (``verispec generate --adjacency``
reads it). Never a held-out prompt.

A/B (``--table``): per held-out prompt (HumanEval 0..N-1 and ``--per-category`` held-out Spec-Bench
prompts of translation, summarization, qa, math_reasoning and rag), a fresh default decoder with
an empty table ("empty", what a fresh process had before) and one started from a copy of the
table ("warm") generate ``--repeats`` times each, in the order A B B A ..., with the same seed:
the texts are the same (drafts only), so the tokens are too. Printed: each prompt's ratio of
decoding tokens per second (prefill excluded) warm / empty, their geometric mean, min and max,
per category, and each arm's fraction of the hindsight oracle (``robustness.py``'s definition).
"""

from __future__ import annotations

import argparse
import copy
import time
from collections import defaultdict

import torch

from robustness import SPEC_BENCH, RunRecord, geometric_mean, held_out_prompts, round_prefixes, run_default, score_policy
from verispec.cli.generate import resolve_dtype
from verispec.distill.data import default_spec_bench_path, read_prompt_file, split_prompts
from verispec.engine.decoder import SpeculativeDecoder
from verispec.models.default import encode_prompt, load_default_target
from verispec.models.token_tree import AdjacencyTable

CATEGORIES = ("translation", "summarization", "qa", "math_reasoning", "rag")


def build(model, tokenizer, args) -> None:
    decoder = SpeculativeDecoder(model, tokenizer=tokenizer, temperature=0.0, max_new_tokens=args.max_new_tokens)
    if args.prompts_file:
        prompts = read_prompt_file(args.prompts_file)
    else:
        prompts = split_prompts("train", default_spec_bench_path() or SPEC_BENCH)
    prompts = prompts[: args.limit]
    start = time.perf_counter()
    for prompt in prompts:
        decoder.generate(encode_prompt(tokenizer, prompt.text))
    table = decoder.drafter.adjacency
    table.save(args.build, target="SmolLM2-135M-Instruct")
    rows = int((table.next_tokens[:, 0] >= 0).sum())
    print(f"{len(prompts)} prompts x {args.max_new_tokens} tokens in {time.perf_counter() - start:.0f} s: "
          f"{rows} rows of {table.vocab_size} written to {args.build}")


def decode(model, tokenizer, ids, table, args, seed: int, record: RunRecord) -> tuple[int, float]:
    """(tokens, decoding seconds) of one run; its rounds' policy and oracle scores added to ``record``."""
    decoder = SpeculativeDecoder(model, tokenizer=tokenizer, temperature=args.temperature, max_new_tokens=args.max_new_tokens,
                                 eos_token_id=[] if args.temperature > 0 else None, adjacency=table)
    output, trees, extra = run_default(decoder, ids, seed)
    score_policy(record, round_prefixes(trees, output, decoder.cost_model.table(max(t.offered.num_nodes for t in trees))))
    return output.new_tokens, output.seconds - output.prefill_seconds - extra


def ab(model, tokenizer, args) -> None:
    table = AdjacencyTable.load(args.table, model.config.vocab_size)
    prompts = held_out_prompts(None, args.per_category, default_spec_bench_path() or SPEC_BENCH, list(CATEGORIES), args.humaneval)
    arms = {"empty": None, "warm": table}
    scores = {name: RunRecord(name, "") for name in arms}  # each arm's policy and oracle, over all runs
    ratios, by_category = [], defaultdict(list)
    for index, prompt in enumerate(prompts):
        ids = encode_prompt(tokenizer, prompt.text)
        totals = {name: [0, 0.0] for name in arms}
        for repeat in range(args.repeats):
            for name in (("empty", "warm") if (repeat + index) % 2 == 0 else ("warm", "empty")):
                tokens, seconds = decode(model, tokenizer, ids, arms[name] and copy.deepcopy(arms[name]), args, index, scores[name])
                totals[name][0] += tokens
                totals[name][1] += seconds
        ratio = (totals["warm"][0] / totals["warm"][1]) / (totals["empty"][0] / totals["empty"][1])
        ratios.append(ratio)
        by_category[prompt.category].append(ratio)
        print(f"  {prompt.prompt_id:<14} {prompt.category:<15} warm / empty {ratio:.3f}", flush=True)
    for category, values in by_category.items():
        print(f"  category {category:<15} geometric mean {geometric_mean(values):.3f}")
    print(f"T = {args.temperature}: decoding speed warm / empty, geometric mean {geometric_mean(ratios):.3f} "
          f"(min {min(ratios):.3f}, max {max(ratios):.3f}) over {len(ratios)} prompts x {args.repeats} repeats")
    for name, r in scores.items():
        fraction = (r.policy_tokens / r.policy_cost) / (r.oracle_tokens / r.oracle_cost)
        print(f"  {name}: {100 * fraction:.1f}% of the hindsight oracle's tokens per second")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--build", metavar="OUT", help="decode the training prompts and write the table here")
    mode.add_argument("--table", metavar="FILE", help="A/B this table against an empty one on held-out prompts")
    parser.add_argument("--prompts-file", default=None, help="--build: decode these prompts instead of the training ones")
    parser.add_argument("--limit", type=int, default=None, help="--build: only the first N prompts")
    parser.add_argument("--humaneval", type=int, default=10)
    parser.add_argument("--per-category", type=int, default=3)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--dtype", default="auto", choices=["auto", "fp32", "bf16"])
    args = parser.parse_args()
    torch.set_num_threads(1)
    model, tokenizer = load_default_target(resolve_dtype(args.dtype))
    print(f"# {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, dtype {args.dtype}, 1 thread")
    if args.build:
        build(model, tokenizer, args)
    else:
        ab(model, tokenizer, args)


if __name__ == "__main__":
    main()
