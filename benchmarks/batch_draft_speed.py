"""Batched decoding with a draft model: B sequences together vs each alone, interleaved in one process.

    python benchmarks/batch_draft_speed.py [--batch 4] [--prompts 0-7] [--tokens 32] [--repeats 3]
                                           [--draft-layers 4] [--draft-len 3] [--threads 1] [--dtype auto]
                                           [--draft cut|head] [--adaptive]

``--draft cut`` (default): no trained draft model ships offline, so the draft is CUT from the default
target: its embedding, its first ``--draft-layers`` decoder layers, its final norm and output layer
(a Llama the native runner runs; it accepts few tokens: this measures the machinery's throughput,
not a good draft). ``--draft head``: the shipped EAGLE-3 head (its steps batched as one padded call,
its features from the batched target forward). ``--adaptive``: method ``gumbel`` with L chosen per round
(at most ``--draft-len``; alone by the decoder's cost model, in the batch by the batch budget, whose
round overhead includes the draft forwards) instead of ``sd`` with a fixed L.
The HumanEval prompts go in groups of B; each group is decoded greedily with method ``sd`` and a
fixed chain of ``--draft-len`` tokens by
    alone   ``generate`` on each prompt of the group in turn (the single-sequence path)
    batch   ``generate_batch`` of the group (one packed draft forward per draft step, one packed
            target forward per round)
and, for reference, plain decoding of the group by ``generate_batch`` with method "ar" (plain-batch).
Configurations alternate per group, their order rotating every repeat, so load drifts hit them
alike. Printed: total tokens/s (all tokens / wall time) and per CPU second of this process, the
batch's ratio to alone, medians over repeats with [min, max]; block efficiency; and whether the
greedy tokens equal the alone tokens (differences = float batch-variance flips).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from transformers import LlamaForCausalLM

from batch_speed import cpu_name, groups, parse_range  # noqa: E402  (benchmarks/ is the script's path)
from verispec.cli.generate import DTYPE_CHOICES, resolve_dtype


def cut_draft(target: LlamaForCausalLM, layers: int) -> LlamaForCausalLM:
    """A Llama with ``target``'s embedding, first ``layers`` layers, final norm and output layer."""
    config = target.config.to_dict() | {"num_hidden_layers": layers}
    draft = LlamaForCausalLM(type(target.config).from_dict(config)).to(target.dtype).eval()
    missing = draft.load_state_dict(target.state_dict(), strict=False).missing_keys
    if missing:
        raise RuntimeError(f"the cut draft misses {missing}")
    return draft


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--prompts", default="0-7", help="HumanEval task ids, e.g. 0-7")
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--draft", default="cut", choices=["cut", "head"])
    parser.add_argument("--adaptive", action="store_true", help="gumbel with L per round instead of sd with a fixed L")
    parser.add_argument("--draft-layers", type=int, default=4)
    parser.add_argument("--draft-len", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--dtype", default="auto", choices=DTYPE_CHOICES)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    from verispec.bench.datasets import humaneval_prompts
    from verispec.engine.decoder import SpeculativeDecoder
    from verispec.models.default import encode_prompt, load_default_target

    ids = parse_range(args.prompts)
    target, tokenizer = load_default_target(resolve_dtype(args.dtype))
    draft = cut_draft(target, args.draft_layers) if args.draft == "cut" else "head"
    tasks = humaneval_prompts(limit=max(ids) + 1)
    prompts = [encode_prompt(tokenizer, tasks[i].text) for i in ids]
    common = dict(tokenizer=tokenizer, temperature=0, max_new_tokens=args.tokens, eos_token_id=[])
    shape = dict(method="gumbel", max_draft_len=args.draft_len) if args.adaptive else dict(method="sd", draft_len=args.draft_len)
    speculative = SpeculativeDecoder(target, draft, **shape, **common)
    plain = SpeculativeDecoder(target, method="ar", **common)
    plain.target.runner.share_weights_from(speculative.target.runner)
    reference = [speculative.generate(p).token_ids for p in prompts]  # also warms both models up

    def decode(name, batch):
        if name == "alone":
            return [speculative.generate(p) for p in batch]
        return (speculative if name == "batch" else plain).generate_batch(batch, max_batch=args.batch)

    names = ["alone", "batch", "plain-batch"]
    rates: dict[str, list[tuple[float, float]]] = {name: [] for name in names}  # per repeat: (wall, cpu) tok/s
    efficiency: dict[str, list[float]] = {name: [] for name in names}
    same = {name: [0, 0] for name in names}
    for repeat in range(args.repeats):
        order = names[repeat % len(names):] + names[: repeat % len(names)]
        totals = {name: [0, 0.0, 0.0] for name in names}  # tokens, wall, cpu
        for group in groups(len(prompts), args.batch):
            for name in order:
                wall, cpu = time.perf_counter(), time.process_time()
                outputs = decode(name, [prompts[i] for i in group])
                total = totals[name]
                total[0] += sum(o.new_tokens for o in outputs)
                total[1] += time.perf_counter() - wall
                total[2] += time.process_time() - cpu
                efficiency[name] += [o.block_efficiency for o in outputs]
                same[name][0] += sum(o.token_ids == reference[i] for o, i in zip(outputs, group))
                same[name][1] += len(outputs)
        for name, (tokens, wall, cpu) in totals.items():
            rates[name].append((tokens / wall, tokens / cpu))

    def spread(values):
        return f"{statistics.median(values):7.2f} [{min(values):.2f}, {max(values):.2f}]"

    print(f"{cpu_name()}, {args.dtype} ({next(target.parameters()).dtype}), {torch.get_num_threads()} thread(s), "
          f"HumanEval {args.prompts}, B = {args.batch}, {args.tokens} tokens, greedy, {'gumbel L <= ' if args.adaptive else 'sd L = '}{args.draft_len}, draft = "
          f"{'the shipped head' if args.draft == 'head' else f'the target' + chr(39) + f's first {args.draft_layers} layers'}, {args.repeats} repeats, {time.strftime('%Y-%m-%d %H:%M')}")
    columns = ["total tok/s", "total tok/cpu-s", "vs alone (wall)", "vs alone (cpu)"]
    print(f"{'config':>11}  {'BE':>5}  " + "  ".join(f"{c:>22}" for c in columns) + "  same tokens as alone")
    for name in names:
        cells = [
            [wall for wall, _ in rates[name]],
            [cpu for _, cpu in rates[name]],
            [r[0] / a[0] for r, a in zip(rates[name], rates["alone"])],
            [r[1] / a[1] for r, a in zip(rates[name], rates["alone"])],
        ]
        print(f"{name:>11}  {statistics.mean(efficiency[name]):5.2f}  " + "  ".join(f"{spread(c):>22}" for c in cells)
              + f"  {same[name][0]} of {same[name][1]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
