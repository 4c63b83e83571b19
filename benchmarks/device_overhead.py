"""Is a device's decode step bound by the host? Kernel-launch cost and forward time by scored tokens.

    python benchmarks/device_overhead.py [--device cuda] [--repeats 10]

Random weights of the default target's shape (SmolLM2-135M: 30 layers, hidden 576, vocabulary
49,152) in bf16 on --device, so no model file is needed (the first CUDA run carried none). Prints:
the cost of launching a tiny kernel (``x.add_(1)`` on 16 elements, synchronized) and of small
host-to-device / device-to-host copies; the median ms of one forward over n = 1, 4, 16, 64, 256
scored tokens after 200 cached tokens, for the native runner and the transformers runner; and on
CUDA the number of kernels one 1-token native forward launches and their summed GPU time (torch
profiler). A forward far longer than its GPU time is launch-bound: the fix is a captured or compiled
step, not a faster kernel.
"""

from __future__ import annotations

import argparse
import time

import torch
from runner_speed import time_forward
from transformers import LlamaConfig, LlamaForCausalLM

from verispec.models.hf import TransformersRunner
from verispec.models.native_llama import NativeLlamaRunner

SIZES = (1, 4, 16, 64, 256)


def default_shaped_model(device: str) -> LlamaForCausalLM:
    config = LlamaConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                         num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=8192,
                         tie_word_embeddings=True, rms_norm_eps=1e-5)
    torch.manual_seed(0)
    return LlamaForCausalLM(config).to(torch.bfloat16).to(device).eval()


def per_call_us(call, count: int, sync) -> float:
    sync()
    start = time.perf_counter()
    for _ in range(count):
        call()
    sync()
    return (time.perf_counter() - start) / count * 1e6


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu", help="cpu or cuda[:N]")
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args(argv)
    device = args.device
    sync = (lambda: torch.cuda.synchronize(device)) if device.startswith("cuda") else (lambda: None)
    tiny = torch.ones(16, device=device)
    per_call_us(lambda: tiny.add_(1), 100, sync)  # warm-up
    print(f"tiny kernel: {per_call_us(lambda: tiny.add_(1), 2000, sync):.1f} us each")
    print(f"small host-to-device copy: {per_call_us(lambda: torch.tensor([1, 2, 3], device=device), 200, sync):.1f} us")
    print(f"small device-to-host copy: {per_call_us(lambda: tiny.cpu(), 200, sync):.1f} us")
    model = default_shaped_model(device)
    context = list(range(1000, 1200))
    with torch.no_grad():
        for name, runner in (("native", NativeLlamaRunner(model)), ("transformers", TransformersRunner(model))):
            time_forward(runner, context, [5], 3)  # warm-up
            cells = [f"{n}: {time_forward(runner, context, list(range(7, 7 + n)), args.repeats)[0]:.1f}" for n in SIZES]
            print(f"{name} runner, ms per forward by scored tokens:", "  ".join(cells))
        if device.startswith("cuda"):
            from torch.profiler import ProfilerActivity, profile

            runner = NativeLlamaRunner(model)
            runner.reset()
            runner.forward(context, list(range(len(context))), None, keep=1)
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as profiled:
                runner.forward([5], [len(context)], None, keep=1)
                sync()
            kernels = [e for e in profiled.events() if e.device_type == torch.autograd.DeviceType.CUDA]
            busy = sum(e.device_time for e in kernels) / 1000
            print(f"one 1-token native forward: {len(kernels)} CUDA kernels, GPU busy {busy:.2f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
