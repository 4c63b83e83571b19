"""The shared growable KV cache (``models.kv_buffer.KVBuffers``) against the per-class copies it
replaced, side by side in one process: does folding them slow either user?

    OMP_NUM_THREADS=1 python benchmarks/kv_buffer_speed.py [--baseline 0c29ee3] [--model default|tiny] [--repeats 40] [--clock thread|wall]

The baseline versions of ``models/native_llama.py`` and ``engine/head_drafter.py`` (each with its own
``_reserve``) are read with ``git show BASELINE:path`` and loaded as separate modules; the current
ones come from the installed/PYTHONPATH package. Each side gets its own adapter over ONE model (the
weights are shared; each side has its own KV caches), the same random head and the same prompt.
Timed per repeat, interleaved (old new, new old, old new, ...: neither always first):
    target L=4   the verification forward of a 5-node chain (root + 4 drafted tokens) and its rollback
    head step    ``HeadDrafter.begin_round`` + one deeper level (a chain draft step)
    growth       a fresh runner's prefill of --context tokens from an initial capacity of 8 (the cache
                 doubles 5-6 times; the only path where ``reserve`` does real work)
Outputs are compared too (logits / q rows must be bit-identical: the fold changes no behaviour).
Prints per-configuration medians and the per-repeat ratio new / old (median, 10-90 % range).
--model tiny: a 2-layer hidden-64 Llama, where per-call Python overhead is a large share of a call.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

from verispec.core.sampling import SamplingParams
from verispec.engine import head_drafter as new_head_drafter
from verispec.models import native_llama as new_native_llama
from verispec.models.eagle_head import Eagle3Head, HeadConfig
from verispec.models.hf import HFModelAdapter

REPO = Path(__file__).resolve().parent.parent


def load_baseline(revision: str, path: str, name: str):
    """The module at ``path`` as of git ``revision``, imported under ``name``."""
    source = subprocess.run(["git", "-C", str(REPO), "show", f"{revision}:{path}"], check=True,
                            capture_output=True, text=True).stdout
    spec = importlib.util.spec_from_loader(name, loader=None)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    exec(compile(source, f"{revision}:{path}", "exec"), module.__dict__)
    return module


def make_model(kind: str):
    if kind == "default":
        from verispec.models.default import load_default_target

        return load_default_target(torch.float32)[0]
    from transformers import AutoModelForCausalLM, LlamaConfig

    config = LlamaConfig(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=8,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096)
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config, attn_implementation="sdpa").eval()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--baseline", default="0c29ee3", help="git revision with the per-class _reserve copies")
    parser.add_argument("--model", default="default", choices=["default", "tiny"])
    parser.add_argument("--context", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=40)
    parser.add_argument("--draft-vocab", type=int, default=8192)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--clock", default="thread", choices=["thread", "wall"],
                        help="thread: this thread's CPU time (time.thread_time; time preempted by other "
                             "processes on a shared machine is left out); wall: time.perf_counter")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    old_native = load_baseline(args.baseline, "src/verispec/models/native_llama.py", "baseline_native_llama")
    old_head_drafter = load_baseline(args.baseline, "src/verispec/engine/head_drafter.py", "baseline_head_drafter")

    model = make_model(args.model)
    vocab = int(model.config.vocab_size)
    draft_vocab = min(args.draft_vocab, vocab)
    torch.manual_seed(0)
    head = Eagle3Head(HeadConfig.for_target(model.config, draft_vocab), torch.arange(draft_vocab))
    with torch.no_grad():
        for parameter in head.parameters():
            torch.nn.init.normal_(parameter, std=0.02)
    head = head.eval()
    params = SamplingParams(0.6, 0, 1.0)
    rng = np.random.default_rng(0)
    prompt = [int(t) for t in rng.integers(0, vocab, args.context)]
    chain = [-1, *[int(t) for t in rng.integers(0, vocab, 4)]]

    sides = {}
    for side, native, drafting in (("old", old_native, old_head_drafter), ("new", new_native_llama, new_head_drafter)):
        adapter = HFModelAdapter(model)
        adapter.runner = native.NativeLlamaRunner(model)
        drafter = drafting.HeadDrafter(head, adapter, params)
        adapter.enable_features(drafter.feature_layers)
        adapter.reset(prompt)
        drafter.reset(prompt)
        drafter.begin_round()  # consumes the prompt's entries; each repeat re-drafts below the same root
        sides[side] = (native, adapter, drafter)

    def target_chain(side):
        _, adapter, _ = sides[side]
        return adapter.score(chain, [-1, 0, 1, 2, 3])

    def head_step(side):
        _, _, drafter = sides[side]
        return torch.as_tensor(np.asarray(drafter.begin_round()((chain[1],))))

    def growth(side):
        native = sides[side][0]
        runner = native.NativeLlamaRunner(model, initial_capacity=8)
        return runner.forward(prompt, list(range(len(prompt))), None, keep=1)

    timed = {"target L=4": target_chain, "head step": head_step, "growth": growth}
    for name, function in timed.items():  # warm-up, and the fold must not change any output
        for _ in range(2):
            old, new = function("old"), function("new")
        if not torch.equal(torch.as_tensor(old), torch.as_tensor(new)):
            raise SystemExit(f"{name}: outputs differ between the baseline and the current code")
    times = {(name, side): [] for name in timed for side in ("old", "new")}
    clock = time.thread_time if args.clock == "thread" else time.perf_counter
    for repeat in range(args.repeats):
        order = ("old", "new") if repeat % 2 == 0 else ("new", "old")  # neither side always runs first
        for name, function in timed.items():
            for side in order:
                start = clock()
                function(side)
                times[name, side].append((clock() - start) * 1000)
    print(f"{args.model} target fp32, context {args.context}, head D = {draft_vocab}, {args.threads} thread(s), "
          f"{args.repeats} interleaved repeats, {args.clock} clock, baseline {args.baseline}; outputs bit-identical")
    print(f"{'configuration':14s} {'old ms':>9s} {'new ms':>9s} {'new/old':>8s} {'p10':>7s} {'p90':>7s}")
    for name in timed:
        old, new = np.array(times[name, "old"]), np.array(times[name, "new"])
        ratios = new / old
        print(f"{name:14s} {statistics.median(old):9.3f} {statistics.median(new):9.3f} {np.median(ratios):8.3f} "
              f"{np.percentile(ratios, 10):7.3f} {np.percentile(ratios, 90):7.3f}")


if __name__ == "__main__":
    main()
