"""``verispec export-head head|RUN --format eagle3|speculators --out DIR``: write a head in the
checkpoint format SGLang (eagle3) or vLLM (speculators) loads (``models.head_formats``)."""

from __future__ import annotations

import sys

DTYPE_NAMES = ("keep", "fp32", "bf16", "fp16")


def add_export_head_parser(sub) -> None:
    parser = sub.add_parser("export-head", help="write an EAGLE-3 head as an SGLang (eagle3) or vLLM (speculators) checkpoint")
    parser.add_argument("source", help="'head' (the shipped head), a head directory (any format), or a `verispec "
                                       "train-head` run directory (its best/, else final/)")
    parser.add_argument("--format", required=True, choices=["eagle3", "speculators"],
                        help="eagle3: SGLang / EAGLE LlamaForCausalLMEagle3; speculators: vLLM's speculators format")
    parser.add_argument("--out", required=True, help="output directory (config.json + model.safetensors)")
    parser.add_argument("--verifier", default="HuggingFaceTB/SmolLM2-135M-Instruct",
                        help="target model id or path recorded as speculators_config.verifier.name_or_path")
    parser.add_argument("--speculative-tokens", type=int, default=3,
                        help="draft length recorded as speculators_config.proposal_methods[0].speculative_tokens")
    parser.add_argument("--dtype", default="keep", choices=DTYPE_NAMES, help="cast the weights (default: as stored)")
    parser.add_argument("--target", default=None,
                        help="check the head against this target ('default' or a model directory); needed for a "
                             "published head that names no feature layer ids (EAGLE-3's default depends on the target)")


def run_export_head(args) -> int:
    import torch

    from verispec.models.head_formats import export_head, head_format, load_any_head, resolve_head_dir
    from verispec.errors import ConfigError

    directory = resolve_head_dir(args.source)
    target_config = None
    if args.target:
        from verispec.models.default import load_model

        target_config = load_model(args.target, torch.float32, "cpu")[0].config
    head = load_any_head(directory, target_config)
    dtype = {"keep": None, "fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[args.dtype]
    if args.dtype == "keep":  # load_any_head returns float32: restore the stored floating dtype
        from safetensors import safe_open

        from verispec.models.head_formats import WEIGHTS_FILE
        from verispec.models.eagle_head import HEAD_WEIGHTS_FILE

        weights = directory / (HEAD_WEIGHTS_FILE if head_format(directory) == "native" else WEIGHTS_FILE)
        if weights.is_file():
            with safe_open(str(weights), "pt") as handle:
                name = next((n for n in handle.keys() if n.endswith("fc.weight")), None)
                dtype = handle.get_slice(name).get_dtype() if name else None
            dtype = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16}.get(dtype)
    if args.speculative_tokens < 1:
        raise ConfigError(f"--speculative-tokens must be >= 1, got {args.speculative_tokens}")
    out = export_head(head, args.out, args.format, args.verifier, args.speculative_tokens, dtype)
    print(f"export-head: {directory} ({head_format(directory)}) -> {out} ({args.format}: config.json, model.safetensors)",
          file=sys.stderr)
    return 0
