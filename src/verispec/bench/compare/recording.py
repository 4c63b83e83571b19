"""Stage 1 of ``verispec compare``, ``record``: the grid of live configurations and their recordings.

For every point of the grid (draft, live rule, K, L, tree shape, temperature) and every seed, the
live engine decodes held-out prompts and ``bench.replay.TreeRecorder`` keeps every verified tree
(target rows as verified and the model's own rows, draft rows, raw paths) plus the live run's
timings, one ``.npz`` per (point, seed) under ``OUT/trees``.

The draft: the shipped EAGLE-3 head (a proper q over an 8,192-token sub-vocabulary) for every rule
it can run losslessly. GBV-mod and SpecTr-GBV★ modify later target rows assuming q of a prefix
depends on its tokens alone, which a head's q does not (the engine refuses the pair), so their
family uses a self-draft: the target itself sampled at draft temperature 1.8, a real model's q with
block efficiency ~2 at L = 4; it measures block efficiency, not speed (the draft costs a target
forward).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from verispec.bench.replay import TREES_DIR, TreeRecorder
from verispec.errors import ConfigError


SELF_DRAFT = "self"
SELF_DRAFT_TEMPERATURE = 1.8


@dataclass(frozen=True)
class GridPoint:
    """One live configuration. ``family`` groups the points a claim reads: "paths" (head, K i.i.d.
    paths), "star" (self-draft, modifying rules live), "binary" (head, binary trees as in SpecHub's
    experiments)."""

    family: str
    live_method: str
    draft: str
    num_drafts: int
    draft_len: int
    temperature: float
    tree: tuple[int, ...] | None = None

    @property
    def nodes(self) -> int:
        """Tree nodes incl. the root (binary trees: 2^(d+1) - 1); K x L + 1 at most for paths."""
        if self.tree is None:
            return self.num_drafts * self.draft_len + 1
        total, width = 1, 1
        for children in self.tree:
            width *= children
            total += width
        return total

    @property
    def label(self) -> str:
        shape = "tree" + "-".join(map(str, self.tree)) if self.tree else f"K{self.num_drafts}-L{self.draft_len}"
        return f"{self.family}__{self.live_method}__{self.draft}__{shape}__T{self.temperature:g}"


def make_grid(ks=(1, 2, 3, 4), lengths=(2, 4, 6, 8), temperatures=(0.3, 0.6, 1.0), binary_depths=(1, 2, 3, 4),
              families=None) -> list[GridPoint]:
    """The sweep of ``verispec compare``, one factor at a time around (K0, L0, T0) = (2, 4, 0.6) (or
    the first value given): K, L and T on the head's K-path trees with GMPBV live; K with SpecTr-GBV★ live
    (and the published SpecTr-GBV at K0) on the self-draft; binary trees of the given depths
    (3, 7, 15, 31 nodes) at T = 1 under the three sampling schemes of RRS, RRSw and SpecHub."""
    ks, lengths, temperatures = list(ks), list(lengths), [float(t) for t in temperatures]
    if not ks or not lengths or not temperatures or min(ks) < 1 or min(lengths) < 1 or min(temperatures) <= 0:
        raise ConfigError(f"K, L and temperatures need positive values (T > 0: sampled drafts), got K={ks}, L={lengths}, "
                          f"T={temperatures}")
    k0 = 2 if 2 in ks else ks[0]
    l0 = 4 if 4 in lengths else lengths[0]
    t0 = 0.6 if 0.6 in temperatures else temperatures[0]
    points = [GridPoint("paths", "gmpbv", "head", k, l0, t0) for k in ks]
    points += [GridPoint("paths", "gmpbv", "head", k0, length, t0) for length in lengths if length != l0]
    points += [GridPoint("paths", "gmpbv", "head", k0, l0, t) for t in temperatures if t != t0]
    points += [GridPoint("star", "spectr-gbv-star", SELF_DRAFT, k, l0, t0) for k in ks]
    points += [GridPoint("star", "spectr-gbv", SELF_DRAFT, k0, l0, t0)]
    for live in ("rrs", "rrsw", "spechub"):
        points += [GridPoint("binary", live, "head", 2, depth, 1.0, tree=(2,) * depth) for depth in binary_depths]
    unique = list(dict.fromkeys(points))
    return [p for p in unique if families is None or p.family in families]


def default_grid() -> list[GridPoint]:
    return make_grid()


@dataclass
class RecordConfig:
    """Stage 1. Prompts: HumanEval ``start`` .. ``start + limit - 1`` (0-39 are held out from every
    draft's training), or a Spec-Bench JSONL file's held-out ids (divisible by 5), ``limit`` per
    category."""

    out: str = "compare_out"
    K: list[int] = field(default_factory=lambda: [1, 2, 3, 4])
    L: list[int] = field(default_factory=lambda: [2, 4, 6, 8])
    temperatures: list[float] = field(default_factory=lambda: [0.3, 0.6, 1.0])
    binary_depths: list[int] = field(default_factory=lambda: [1, 2, 3, 4])
    dataset: str = "humaneval"
    limit: int = 10
    start: int = 0
    max_new_tokens: int = 32
    seeds: list[int] = field(default_factory=lambda: [0, 1])
    per_prompt: int | None = 12
    top_p: float = 1.0
    target: str | None = None  # None: the embedded default target
    draft: str = "head"  # 'head', a head directory, or a draft model directory
    self_draft_temperature: float = SELF_DRAFT_TEMPERATURE
    families: list[str] | None = None  # record only these families (None: all)
    shard: tuple[int, int] = (0, 1)  # (index, count): this process records points index, index + count, ...

    def grid(self) -> list[GridPoint]:
        return make_grid(self.K, self.L, self.temperatures, self.binary_depths, self.families)

    def validate(self) -> "RecordConfig":
        if self.limit < 1 or (self.dataset == "humaneval" and self.limit < 2):
            raise ConfigError(f"limit must be >= 2 prompts (intervals are over prompts), got {self.limit}")
        if self.dataset == "humaneval" and (self.start < 0 or self.start + self.limit > 40):
            raise ConfigError(f"prompts {self.start}..{self.start + self.limit - 1} leave HumanEval 0-39, the held-out "
                              "prompts; use start + limit <= 40")
        if not self.seeds:
            raise ConfigError("give at least one seed (--seeds 0,1)")
        index, count = self.shard
        if not 0 <= index < count:
            raise ConfigError(f"shard must be INDEX/COUNT with 0 <= INDEX < COUNT, got {index}/{count}")
        self.grid()
        return self

    def prompts(self):
        from verispec.bench.datasets import humaneval_prompts, spec_bench_prompts

        if self.dataset == "humaneval":
            return humaneval_prompts(self.start + self.limit)[self.start :]
        held_out = [p for p in spec_bench_prompts(self.dataset) if p.prompt_id.isdigit() and int(p.prompt_id) % 5 == 0]
        per_category: dict[str, int] = {}
        chosen = []
        for prompt in held_out:
            if per_category.get(prompt.category, 0) < self.limit:
                per_category[prompt.category] = per_category.get(prompt.category, 0) + 1
                chosen.append(prompt)
        if len(chosen) < 2:
            raise ConfigError(f"{self.dataset}: fewer than 2 held-out prompts (question ids divisible by 5)")
        return chosen


def record_point(point: GridPoint, seed: int, config: RecordConfig, target, tokenizer, prompts, draft="head") -> Path:
    """Decode every prompt live with the point's rule; save the recording with its live timings."""
    from verispec.bench.runner import prompt_seed
    from verispec.core.rng import SeededRng
    from verispec.engine.decoder import SpeculativeDecoder
    from verispec.models.default import encode_prompt

    recorder = TreeRecorder(limit=10**9, per_prompt=config.per_prompt)
    decoder = SpeculativeDecoder(
        target, target if point.draft == SELF_DRAFT else draft, tokenizer=tokenizer, method=point.live_method,
        num_drafts=point.num_drafts, draft_len=point.draft_len, tree=list(point.tree) if point.tree else None,
        temperature=point.temperature, top_p=config.top_p, max_new_tokens=config.max_new_tokens,
        draft_temperature=config.self_draft_temperature if point.draft == SELF_DRAFT else None,
        step_callback=recorder.callback,
    )
    live = []
    for index, prompt in enumerate(prompts):
        recorder.current_prompt = str(prompt.prompt_id)
        output = decoder.generate(encode_prompt(tokenizer, prompt.text), rng=SeededRng(prompt_seed(seed, index)))
        breakdown = output.time_breakdown()
        live.append({"prompt_id": str(prompt.prompt_id), "new_tokens": output.new_tokens, "target_calls": output.target_calls,
                     "seconds": output.seconds, **{f"{part}_seconds": float(value) for part, value in breakdown.items()}})
    meta = {**asdict(point), "method": point.live_method, "K": point.num_drafts, "L": point.draft_len, "seed": seed,
            "label": f"{point.label}__s{seed}", "top_p": config.top_p, "per_prompt": config.per_prompt,
            "draft_temperature": config.self_draft_temperature if point.draft == SELF_DRAFT else None,
            "max_new_tokens": config.max_new_tokens, "dataset": config.dataset, "live": live,
            "draft_source": config.draft if point.draft != SELF_DRAFT else "self"}
    path = Path(config.out) / TREES_DIR / f"{meta['label']}.npz"
    recorder.save(path, meta)
    return path


def load_pair(config: RecordConfig):
    """(target, tokenizer, draft) for the head families: the draft is 'head' / a head directory
    (loaded by the decoder) or a draft model directory."""
    import torch

    from verispec.engine.head_drafter import is_head_source
    from verispec.models.default import load_default_target, load_model

    if config.target is None:
        target, tokenizer = load_default_target()
    else:
        target, tokenizer = load_model(config.target, torch.float32, "cpu")
    draft = config.draft if is_head_source(config.draft) else load_model(config.draft, torch.float32, "cpu")[0]
    return target, tokenizer, draft


def record_grid(config: RecordConfig, target=None, tokenizer=None, draft=None, progress: bool = True) -> list[Path]:
    """Stage 1 over the grid (this shard's points), skipping recordings that already exist (a
    stopped run resumes)."""
    config.validate()
    if target is None:
        target, tokenizer, draft = load_pair(config)
    prompts = config.prompts()
    index, count = config.shard
    paths = []
    for point in config.grid()[index::count]:
        for seed in config.seeds:
            path = Path(config.out) / TREES_DIR / f"{point.label}__s{seed}.npz"
            if path.is_file():
                paths.append(path)
                continue
            tic = time.perf_counter()
            paths.append(record_point(point, seed, config, target, tokenizer, prompts, draft))
            if progress:
                print(f"recorded {path.name} in {time.perf_counter() - tic:.0f} s", flush=True)
    return paths
