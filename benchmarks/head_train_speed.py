"""Training throughput of an EAGLE-3 head per TTT depth S, side by side.

One process, torch at --threads threads; the same seeded batches of stored features are trained
with S = each value of --ttt-steps in turn (A B A B ... per batch, --repeats rounds), each on its
own head/optimizer; prints median and spread of entries/s and s/step per S, and the ratio to the
first S. Usage:

    OMP_NUM_THREADS=1 python benchmarks/head_train_speed.py --features RUN/features \
        --ttt-steps 3,4 --batch 8 --context 512 --repeats 6
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--features", required=True, help="feature directory with train/ (from verispec train-head)")
    parser.add_argument("--ttt-steps", default="3,4")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--context", type=int, default=512)
    parser.add_argument("--draft-vocab", type=int, default=8192)
    parser.add_argument("--repeats", type=int, default=6)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    from verispec.distill.data import sub_vocabulary
    from verispec.distill.head_data import feature_shard_paths, load_feature_shards
    from verispec.distill.head_train import (
        HeadTrainConfig, head_loss, make_window_batch, sample_windows, target_to_draft_table, usable_entries,
    )
    from verispec.models.default import load_default_target
    from verispec.models.eagle_head import Eagle3Head, HeadConfig

    target, _ = load_default_target(torch.float32)
    embed = target.get_input_embeddings().weight.detach().float()
    records = load_feature_shards(feature_shard_paths(Path(args.features) / "train"))
    config = HeadConfig.for_target(target.config, args.draft_vocab)
    vocab = sub_vocabulary(records, config.vocab_size, args.draft_vocab)
    weights = torch.tensor([float(usable_entries(r)) for r in records])
    depths = [int(x) for x in args.ttt_steps.split(",")]
    runs = {}
    for s in depths:
        torch.manual_seed(0)
        head = Eagle3Head(config, vocab)
        runs[s] = (head, torch.optim.AdamW(head.parameters(), lr=5e-4), HeadTrainConfig(ttt_steps=s, context=args.context))
    table = target_to_draft_table(runs[depths[0]][0].draft_to_target, config.vocab_size)
    times = {s: [] for s in depths}
    entries = []
    for repeat in range(args.repeats + 1):  # round 0 warms up
        chosen, starts = sample_windows(records, weights, args.batch, args.context, 0, repeat)
        batch = make_window_batch(chosen, starts, args.context, embed, "cpu")
        if repeat:
            entries.append(int(batch["valid"].sum()))
        for s in depths:
            head, optimizer, train_config = runs[s]
            start = time.perf_counter()
            loss, _ = head_loss(head, batch, table, train_config)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            if repeat:
                times[s].append(time.perf_counter() - start)
    print(f"records {len(records)}, batch {args.batch} x context {args.context}, threads {args.threads}, "
          f"entries/step median {statistics.median(entries)}")
    print(f"{'S':>3} {'s/step median':>14} {'min':>7} {'max':>7} {'entries/s':>10} {'time ratio vs S=' + str(depths[0]):>22}")
    base = statistics.median(times[depths[0]])
    for s in depths:
        med = statistics.median(times[s])
        rate = statistics.median([e / t for e, t in zip(entries, times[s])])
        print(f"{s:>3} {med:14.3f} {min(times[s]):7.3f} {max(times[s]):7.3f} {rate:10.0f} {med / base:22.2f}")


if __name__ == "__main__":
    main()
