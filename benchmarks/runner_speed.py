"""Cost of one model forward through each adapter runner, side by side in one run.

    python benchmarks/runner_speed.py [--model default|DIR] [--dtype bf16] [--threads 1] [--context 200] [--sizes 1,5]

For each size of new tokens after a cached context (default 1 and 5: a chain step and an L = 4 target scoring), times
the median of ``--repeats`` forwards of:
    transformers       the model's own forward over a DynamicCache (models.hf.TransformersRunner)
    native, plain      NativeLlamaRunner with F.linear on the module weights
    native, prepacked  NativeLlamaRunner with weights packed once for oneDNN (CPU bf16 and fp32)
and prints milliseconds, the ratio to the transformers runner, and the largest logit difference.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from verispec.cli.generate import DTYPES
from verispec.models.hf import TransformersRunner
from verispec.models.native_llama import NativeLlamaRunner, _can_prepack


def time_forward(runner, context: list[int], new: list[int], repeats: int) -> tuple[float, torch.Tensor]:
    """Median ms of forwards of ``new`` after ``context`` (cache rolled back after each), and the logits."""
    runner.reset()
    runner.forward(context, list(range(len(context))), None, keep=1)
    total = len(context) + len(new)
    allowed = torch.ones(len(new), total, dtype=torch.bool).tril(len(context)) if len(new) > 1 else None
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        logits = runner.forward(new, list(range(len(context), total)), allowed, keep=len(new))
        times.append((time.perf_counter() - start) * 1000)
        runner.keep_entries(len(context))
    return statistics.median(times), logits


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="default", help="'default' (SmolLM2-135M-Instruct) or a model directory")
    parser.add_argument("--dtype", default="bf16", choices=list(DTYPES))
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--context", type=int, default=200, help="cached tokens before the timed forwards")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--sizes", default="1,5", help="comma list of new-token counts per forward (default 1,5)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    import verispec.models.default_draft  # noqa: F401  registers the sub-vocabulary draft architecture
    from verispec.models.default import load_model

    model, _ = load_model(None if args.model == "default" else args.model, DTYPES[args.dtype])
    vocab = int(model.config.vocab_size)
    generator = torch.Generator().manual_seed(0)
    context = torch.randint(0, vocab, (args.context,), generator=generator).tolist()
    runners = {"transformers": TransformersRunner(model), "native, plain": NativeLlamaRunner(model, prepack=False)}
    if _can_prepack(DTYPES[args.dtype], torch.device("cpu")):
        runners["native, prepacked"] = NativeLlamaRunner(model, prepack=True)
    print(f"{args.model}, {args.dtype}, {torch.get_num_threads()} threads, {args.context} cached tokens, "
          f"median of {args.repeats}")
    print(f"{'new tokens':>10}  {'runner':>18}  {'ms':>8}  {'vs transformers':>15}  {'max |logit diff|':>16}")
    for count in [int(size) for size in args.sizes.split(",")]:
        new = torch.randint(0, vocab, (count,), generator=generator).tolist()
        reference_ms, reference = None, None
        for name, runner in runners.items():
            ms, logits = time_forward(runner, context, new, args.repeats)
            if reference is None:
                reference_ms, reference = ms, logits
            finite = torch.isfinite(reference)
            diff = (logits[finite] - reference[finite]).abs().max().item()
            print(f"{count:>10}  {name:>18}  {ms:8.2f}  {reference_ms / ms:14.2f}x  {diff:16.3g}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
