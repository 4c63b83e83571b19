"""Held-out acceptance of an untrained EAGLE-3 head: random init vs ``init_from_target`` (issue 13).

Forward only, on the held-out feature shards; prints alpha / top-1 per depth at T = 0.6 for each
initialisation (same draft vocabulary). Usage:

    OMP_NUM_THREADS=1 python benchmarks/head_init_probe.py --features /root/head-run/features \
        --vocab-from /root/head-run/train1/best --depths 2
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--features", required=True)
    parser.add_argument("--vocab-from", required=True, help="a head directory whose draft vocabulary to use")
    parser.add_argument("--depths", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(1)

    from verispec.distill.head_data import feature_shard_paths, load_feature_shards
    from verispec.distill.head_train import evaluate_head, init_from_target
    from verispec.models.default import load_default_target
    from verispec.models.eagle_head import Eagle3Head, load_head

    target, _ = load_default_target(torch.float32)
    embed = target.get_input_embeddings().weight.detach().float()
    reference = load_head(args.vocab_from)
    records = load_feature_shards(feature_shard_paths(Path(args.features) / "eval"), allow_heldout=True)
    print(f"{'init':<12} " + " ".join(f"alpha{d + 1:>2}" for d in range(args.depths))
          + " " + " ".join(f"top1_{d + 1:>2}" for d in range(args.depths)) + "  coverage")
    for name in ("random", "target"):
        torch.manual_seed(args.seed)
        head = Eagle3Head(reference.config, reference.draft_to_target)
        if name == "target":
            init_from_target(head, target.get_output_embeddings().weight.detach(), target.model.norm.weight.detach())
        result = evaluate_head(head, records, embed, depths=args.depths)
        print(f"{name:<12} " + " ".join(f"{a:7.3f}" for a in result.alpha) + " "
              + " ".join(f"{a:7.3f}" for a in result.top1) + f"  {result.coverage:.3f}")


if __name__ == "__main__":
    main()
