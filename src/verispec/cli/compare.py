"""``verispec compare [record|report|all|live]``: record draft trees on held-out prompts, replay
every lossless rule on them with common random numbers, write the claims table, compare.csv and
the plots (``bench.compare``)."""

from __future__ import annotations

import shlex
import sys


def _ints(text: str) -> list[int]:
    return [int(part) for part in text.split(",") if part.strip()]


def _floats(text: str) -> list[float]:
    return [float(part) for part in text.split(",") if part.strip()]


def add_compare_parser(sub) -> None:
    parser = sub.add_parser("compare", help="the papers' claims on recorded draft trees: every lossless rule, common random numbers")
    parser.add_argument("stage", nargs="?", default="all", choices=["record", "report", "all", "live"],
                        help="record: live runs that record trees; report: replay + claims + plots; all (default): both; "
                             "live: each rule at its best replayed point, live vs plain decoding (writes OUT/live.md)")
    parser.add_argument("--out", default="compare_out", help="folder of the recordings (OUT/trees) and the report")
    parser.add_argument("--target", default=None, help="target model directory (default: the embedded SmolLM2-135M-Instruct)")
    parser.add_argument("--draft", default="head", help="'head' (the shipped EAGLE-3 head), a head directory or a draft model "
                                                        "directory; the modifying rules run on a self-draft regardless")
    parser.add_argument("--dataset", default="humaneval",
                        help="humaneval (prompts start..start+limit-1, within the held-out 0-39) or a Spec-Bench JSONL "
                             "(its held-out ids, divisible by 5; --limit per category)")
    parser.add_argument("--limit", type=int, default=10, help="prompts (per category for Spec-Bench; default 10)")
    parser.add_argument("--start", type=int, default=0, help="first HumanEval prompt (default 0)")
    parser.add_argument("-K", "--num-drafts", dest="K", type=_ints, default=[1, 2, 3, 4], help="comma list (default 1,2,3,4)")
    parser.add_argument("-L", "--draft-len", dest="L", type=_ints, default=[2, 4, 6, 8], help="comma list (default 2,4,6,8)")
    parser.add_argument("--temperatures", type=_floats, default=[0.3, 0.6, 1.0], help="comma list (default 0.3,0.6,1.0)")
    parser.add_argument("--binary-depths", type=_ints, default=[1, 2, 3, 4],
                        help="depths of the binary trees at T = 1 (default 1,2,3,4: 3, 7, 15, 31 nodes)")
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--seeds", type=_ints, default=[0, 1], help="comma list (default 0,1)")
    parser.add_argument("--per-prompt", type=int, default=12, help="rounds recorded per prompt (default 12)")
    parser.add_argument("--families", default=None, help="record only these families: paths,star,binary")
    parser.add_argument("--shard", default="0/1",
                        help="INDEX/COUNT: record (or, with 'report', replay without writing the report) every COUNT-th "
                             "point from INDEX, for parallel processes; a final 'report' without --shard merges")
    parser.add_argument("--repeats", type=int, default=4, help="verifications per tree and rule in the replay (default 4)")
    parser.add_argument("--replay-seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1)")
    parser.add_argument("--live-temperatures", type=_floats, default=[0.6, 1.0], help="live stage: temperatures (comma list)")


def run_compare(args) -> int:
    from pathlib import Path

    import torch

    from verispec.bench.compare import RecordConfig, live_best_markdown, record_grid, replay_all, run_live_best, write_compare_report
    from verispec.errors import ConfigError

    torch.set_num_threads(args.threads)
    try:
        index, count = (int(part) for part in args.shard.split("/"))
    except ValueError as error:
        raise ConfigError(f"--shard must be INDEX/COUNT, e.g. 0/2, got {args.shard!r}") from error
    if args.repeats < 1:
        raise ConfigError(f"--repeats must be >= 1, got {args.repeats}")
    command = "verispec " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    config = RecordConfig(
        out=args.out, K=args.K, L=args.L, temperatures=args.temperatures, binary_depths=args.binary_depths,
        dataset=args.dataset, limit=args.limit, start=args.start, max_new_tokens=args.max_new_tokens, seeds=args.seeds,
        per_prompt=args.per_prompt, target=args.target, draft=args.draft,
        families=args.families.split(",") if args.families else None, shard=(index, count),
    ).validate()
    if args.stage in ("record", "all"):
        record_grid(config)
    if args.stage in ("report", "all"):
        replayed = replay_all(args.out, seed=args.replay_seed, repeats=args.repeats, shard=(index, count))
        if count > 1:
            print(f"replayed shard {index}/{count} into {args.out}/replay; run 'report' without --shard to write the report")
            return 0
        for name, path in write_compare_report(args.out, replayed, command).items():
            print(f"{name}: {path}")
    if args.stage == "live":
        replayed = replay_all(args.out, seed=args.replay_seed, repeats=args.repeats)
        rows = []
        for temperature in args.live_temperatures:
            rows += run_live_best(replayed, temperature, limit=args.limit, max_new_tokens=args.max_new_tokens, seed=args.seeds[0])
        text = live_best_markdown(rows)
        (Path(args.out) / "live.md").write_text(f"`{command}`\n\n{text}")
        print(text)
    return 0
