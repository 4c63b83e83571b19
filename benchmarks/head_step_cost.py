"""Cost of one EAGLE-3 head draft step against one target forward, side by side in one process.

    OMP_NUM_THREADS=1 python benchmarks/head_step_cost.py [--dtype auto] [--context 200] [--repeats 30] [--draft-vocab 8192]

Target: the default SmolLM2-135M through ``HFModelAdapter`` (native runner) with feature capture on,
as the decoder runs it with a head. Head: a random head of the EAGLE-3 shape
(``HeadConfig.for_target``, D = --draft-vocab) in the target's dtype, driven through ``HeadDrafter``.
After a prompt of --context tokens, each repeat times, interleaved (A B C A B C ...):
    head step    one deeper tree level of one entry (``batch_probs`` of a depth-1 prefix: midlayer,
                 norm, lm_head over D, scatter to V, softmax to a q row), i.e. one chain draft step
    target L=4   the verification forward of a 5-node chain (root + 4 drafted tokens)
    target 1     a one-token forward (plain decoding's step)
Prints per-configuration medians and the per-repeat ratio head / target (median, 10-90 % range).
Speed ratios only mean something measured in one process at one thread: compare rows, not runs.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch

from verispec.cli.generate import resolve_dtype
from verispec.core.sampling import SamplingParams
from verispec.engine.head_drafter import HeadDrafter
from verispec.models.default import load_default_target
from verispec.models.eagle_head import Eagle3Head, HeadConfig
from verispec.models.hf import HFModelAdapter


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dtype", default="auto", choices=["auto", "fp32", "bf16"])
    parser.add_argument("--context", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--draft-vocab", type=int, default=8192)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    dtype = resolve_dtype(args.dtype)
    model, _ = load_default_target(dtype)
    torch.manual_seed(0)
    config = HeadConfig.for_target(model.config, args.draft_vocab)
    head = Eagle3Head(config, torch.arange(args.draft_vocab))
    with torch.no_grad():
        for parameter in head.parameters():
            torch.nn.init.normal_(parameter, std=0.02)
    head = head.to(dtype).eval()
    adapter = HFModelAdapter(model)
    drafter = HeadDrafter(head, adapter, SamplingParams(0.6, 0, 1.0))
    adapter.enable_features(drafter.feature_layers)
    rng = np.random.default_rng(0)
    prompt = [int(t) for t in rng.integers(0, config.vocab_size, args.context)]
    adapter.reset(prompt)
    drafter.reset(prompt)
    drafter.begin_round()  # consumes the prompt's entries; every repeat then re-drafts below the same root
    chain = [-1, *[int(t) for t in rng.integers(0, config.vocab_size, 4)]]

    def head_step():
        drafter.begin_round()((chain[1],))  # one head level (depth-1 prefix), q row included

    def target_chain():
        adapter.score(chain, [-1, 0, 1, 2, 3])

    def target_one():
        adapter.score([-1], [-1])

    timed = {"head step": head_step, "target L=4": target_chain, "target 1": target_one}
    for function in timed.values():  # warm-up: first-call allocations stay out
        for _ in range(3):
            function()
    times = {name: [] for name in timed}
    for _ in range(args.repeats):
        for name, function in timed.items():
            start = time.perf_counter()
            function()
            times[name].append((time.perf_counter() - start) * 1000)
    print(f"SmolLM2-135M {dtype}, context {args.context}, head D = {args.draft_vocab}, "
          f"{args.threads} thread(s), {args.repeats} interleaved repeats")
    print(f"{'configuration':14s} {'median ms':>10s} {'p10':>8s} {'p90':>8s}")
    for name, values in times.items():
        print(f"{name:14s} {statistics.median(values):10.2f} {np.percentile(values, 10):8.2f} {np.percentile(values, 90):8.2f}")
    for target in ("target L=4", "target 1"):
        ratios = np.array(times["head step"]) / np.array(times[target])
        print(f"head step / {target}: median {np.median(ratios):.3f} (p10 {np.percentile(ratios, 10):.3f}, "
              f"p90 {np.percentile(ratios, 90):.3f})")


if __name__ == "__main__":
    main()
