"""``verispec compare record|report|all``: record draft trees on held-out prompts, replay every
lossless rule on them with common random numbers, write the claims table and plots
(``bench.compare``)."""

from __future__ import annotations

import shlex
import sys


def _ints(text: str) -> list[int]:
    return [int(part) for part in text.split(",") if part.strip()]


def add_compare_parser(sub) -> None:
    parser = sub.add_parser("compare", help="the papers' claims on recorded draft trees: every lossless rule, common random numbers")
    parser.add_argument("stage", choices=["record", "report", "all", "live"],
                        help="record: live runs that record trees; report: replay + claims + plots; all: both; "
                             "live: each rule at its best replayed point, live vs plain decoding (writes OUT/live.md)")
    parser.add_argument("--out", default="compare_out", help="folder of the recordings (OUT/trees) and the report")
    parser.add_argument("--grid", default="default", choices=["default", "small"],
                        help="default: K 1-4, L 2-8, T 0.3-1 (head), ★ K 1-4 (self-draft), binary trees 3-31 nodes")
    parser.add_argument("--limit", type=int, default=10, help="HumanEval prompts (held out: 0-39; default 10)")
    parser.add_argument("--start", type=int, default=0, help="first HumanEval prompt (default 0)")
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
    parser.add_argument("--live-temperatures", default="0.6,1.0", help="live stage: temperatures (comma list)")


def run_compare(args) -> int:
    import torch

    from verispec.bench.compare import RecordConfig, record_grid, replay_all, write_compare_report
    from verispec.errors import ConfigError

    torch.set_num_threads(args.threads)
    try:
        index, count = (int(part) for part in args.shard.split("/"))
    except ValueError as error:
        raise ConfigError(f"--shard must be INDEX/COUNT, e.g. 0/2, got {args.shard!r}") from error
    if args.repeats < 1:
        raise ConfigError(f"--repeats must be >= 1, got {args.repeats}")
    if args.stage in ("record", "all"):
        config = RecordConfig(out=args.out, grid=args.grid, limit=args.limit, start=args.start,
                              max_new_tokens=args.max_new_tokens, seeds=args.seeds, per_prompt=args.per_prompt,
                              families=args.families.split(",") if args.families else None, shard=(index, count))
        record_grid(config)
    if args.stage == "live":
        from pathlib import Path

        from verispec.bench.compare import live_best_markdown, run_live_best

        replayed = replay_all(args.out, seed=args.replay_seed, repeats=args.repeats)
        rows = []
        for temperature in (float(t) for t in args.live_temperatures.split(",")):
            rows += run_live_best(replayed, temperature, limit=args.limit, max_new_tokens=args.max_new_tokens, seed=args.seeds[0])
        text = live_best_markdown(rows)
        (Path(args.out) / "live.md").write_text("verispec " + " ".join(shlex.quote(a) for a in sys.argv[1:]) + "\n\n" + text)
        print(text)
        return 0
    if args.stage in ("report", "all"):
        replayed = replay_all(args.out, seed=args.replay_seed, repeats=args.repeats, shard=(index, count))
        if count > 1:
            print(f"replayed shard {index}/{count} into {args.out}/replay; run 'report' without --shard to write the report")
            return 0
        paths = write_compare_report(args.out, replayed, "verispec " + " ".join(shlex.quote(a) for a in sys.argv[1:]))
        for name, path in paths.items():
            print(f"{name}: {path}")
    return 0
