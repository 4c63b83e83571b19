"""Wall time of one ``verifier.verify(tree, rng)`` call for every registered rule, on realistic
draft trees over a large vocabulary.

Usage:
    python benchmarks/verify_speed.py [--vocab 50000] [--num-drafts 4] [--draft-len 8]
                                      [--repeats 200] [--seed 0] [--json rows.json]

Synthetic models (no neural network): for every drafted prefix z the target and the draft get
    p(.|z) = softmax(3 g_z + s e_z),   q(.|z) = softmax(3 g_z + s e'_z)
with g_z, e_z, e'_z i.i.d. standard normal vectors seeded by (seed, z): the shared component g_z
makes acceptance moderate (s = --draft-noise = 0.6 gives sum_x min(p, q) ~ 0.68 per position).
Drafts are really sampled from q with the sampler each rule needs (registry.py):
    'chain' rules  sample_chain(L)
    'paths' rules  sample_iid_paths(K, L)              (trie + raw paths)
    spechub        sample_tree([2, 1, ..., 1], SPECHUB_PAIR)
    sprinter       a chain with verifier_accept_probs = 0.8 at every node
With --tree-variants the rules registered with a ``tree_scheme`` other than SpecHub's (rrs, rrsw,
nss, traversal) get an extra row "<rule>[tree]" on trees of shape [K, 1, ..., 1] drawn with that
scheme (i.i.d. children for rrs, without replacement for the others).
Trees are built and validated outside the timed region (--num-trees distinct trees, cycled);
the timed region is the verify call alone, with a fresh SeededRng(i) built just before it and
the garbage collector paused. Rules are INTERLEAVED: repeat i times one call of every rule, in
an order shuffled per repeat (seeded), so a change of machine load spreads over all rules alike
instead of landing on whichever rule ran during it; median and p90 are over the repeats. All
tree families are held in memory at once for this (about 1 GB at the defaults; lower
--num-trees on a small machine). "otm" is skipped: its LP over V^K tuples is an exponential
small-V reference (§10).

PASS means median <= target. Targets: 2 ms for the O(V)-per-step rules, 10 ms for the rules
that also pick rho or build skewed / modified laws.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import sys
import time
from dataclasses import dataclass

import numpy as np

from verispec.core.rng import SeededRng
from verispec.core.tree import DraftScheme, DraftTree
from verispec.draft.samplers import DraftSkeleton, sample_chain, sample_iid_paths, sample_tree
from verispec.verify.registry import METHODS, MethodSpec

TARGET_MS = {
    **{name: 2.0 for name in ("sd", "bv", "rrs", "rrsw", "spechub", "nss", "traversal")},
    **{name: 10.0 for name in ("spectr", "gbv-mod", "gmpbv", "spectr-gbv", "spectr-gbv-star")},
}
SKIPPED = {"otm": "skipped: exponential LP reference over V^K tuples (ALGORITHMS.md §10), small V only"}
SPRINTER_ACCEPT = 0.8


def softmax(logits: np.ndarray) -> np.ndarray:
    shifted = logits - logits.max()
    weights = np.exp(shifted)
    return weights / weights.sum()


class SyntheticPair:
    """Target and draft next-token laws, (V,) float64 each, lazily drawn and cached per prefix."""

    def __init__(self, vocab: int, seed: int, shared_scale: float = 3.0, noise: float = 0.6):
        self.vocab, self.seed, self.shared_scale, self.noise = vocab, seed, shared_scale, noise
        self._cache: dict[tuple[int, ...], tuple[np.ndarray, np.ndarray]] = {}

    def _laws(self, prefix: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
        if prefix not in self._cache:
            rng = np.random.default_rng([self.seed, len(prefix), *prefix])
            shared, own_target, own_draft = rng.standard_normal((3, self.vocab))
            base = self.shared_scale * shared
            self._cache[prefix] = (softmax(base + self.noise * own_target), softmax(base + self.noise * own_draft))
        return self._cache[prefix]

    def target(self, prefix) -> np.ndarray:
        return self._laws(tuple(prefix))[0]

    def draft(self, prefix) -> np.ndarray:
        return self._laws(tuple(prefix))[1]

    def clear(self) -> None:
        self._cache.clear()


def draft_skeleton(kind: str, rng: SeededRng, pair: SyntheticPair, num_drafts: int, draft_len: int) -> DraftSkeleton:
    """kind: 'chain', 'paths', 'spechub', or 'tree:<scheme>' (shape [K, 1, ..., 1])."""
    if kind.startswith("tree:"):
        return sample_tree(rng, pair.draft, [num_drafts] + [1] * (draft_len - 1), DraftScheme(kind[5:]))
    if kind == "chain":
        return sample_chain(rng, pair.draft, draft_len)
    if kind == "paths":
        return sample_iid_paths(rng, pair.draft, num_drafts, draft_len)
    if kind == "spechub":
        return sample_tree(rng, pair.draft, [2] + [1] * (draft_len - 1), DraftScheme.SPECHUB_PAIR)
    if kind == "deterministic":  # qfree: top-q candidates, K per node at the root, then chains
        return sample_tree(rng, pair.draft, [num_drafts] + [1] * (draft_len - 1), DraftScheme.DETERMINISTIC)
    raise ValueError(f"unknown draft kind {kind!r}")


def draft_kind(spec: MethodSpec) -> str:
    if spec.tree_scheme is DraftScheme.DETERMINISTIC:
        return "deterministic"
    if spec.draft == "tree":
        if spec.tree_scheme is not DraftScheme.SPECHUB_PAIR:
            raise ValueError(f"no tree sampler configured for {spec.name} ({spec.tree_scheme})")
        return "spechub"
    return spec.draft


def build_trees(kind: str, args, with_sprinter_probs: bool = False) -> list[DraftTree]:
    """``args.num_trees`` validated trees; each tree gets its own synthetic model, so the trees
    do not share vectors (no cache effects between repeats)."""
    trees = []
    for index in range(args.num_trees):
        pair = SyntheticPair(args.vocab, seed=args.seed * 100_003 + index, noise=args.draft_noise)
        skeleton = draft_skeleton(kind, SeededRng([args.seed, index]), pair, args.num_drafts, args.draft_len)
        target_probs = np.stack([pair.target(prefix) for prefix in skeleton.prefixes])
        accept = None
        if with_sprinter_probs:
            accept = np.full(skeleton.num_nodes, SPRINTER_ACCEPT)
            accept[0] = 0.0
        tree = skeleton.with_target(target_probs, verifier_accept_probs=accept)
        _ = tree.children, tree.depths  # cached structure, computed outside the timed region
        trees.append(tree)
        pair.clear()
    return trees


@dataclass
class Row:
    rule: str
    draft: str
    nodes: float
    median_ms: float
    p90_ms: float
    mean_ms: float
    min_ms: float
    mean_accepted_len: float
    target_ms: float | None
    status: str


def time_rules(jobs, trees_of: dict, repeats: int, warmup: int, seed: int) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Interleaved timing: for i in range(repeats), one verify call per job in a shuffled order.
    jobs: (label, spec, tree key); returns label -> (times in ms (repeats,), accepted lengths)."""
    order_rng = np.random.default_rng([seed, 7])
    for i in range(warmup):
        for label, spec, key in jobs:
            trees = trees_of[key]
            spec.verifier.verify(trees[i % len(trees)], SeededRng(10**9 + i))
    times = {label: np.empty(repeats) for label, _, _ in jobs}
    accepted = {label: np.empty(repeats) for label, _, _ in jobs}
    for i in range(repeats):
        gc.collect()
        gc.disable()
        try:
            for index in order_rng.permutation(len(jobs)):
                label, spec, key = jobs[index]
                trees = trees_of[key]
                tree = trees[i % len(trees)]
                rng = SeededRng(i)
                start = time.perf_counter_ns()
                result = spec.verifier.verify(tree, rng)
                times[label][i] = (time.perf_counter_ns() - start) / 1e6
                accepted[label][i] = result.accepted_len
        finally:
            gc.enable()
    return {label: (times[label], accepted[label]) for label in times}


def make_row(label: str, spec: MethodSpec, trees: list[DraftTree], times_ms: np.ndarray, accepted: np.ndarray) -> Row:
    target = TARGET_MS.get(spec.name) if label == spec.name else None
    median = float(np.median(times_ms))
    status = "n/a" if target is None else ("PASS" if median <= target else "FAIL")
    return Row(
        rule=label,
        draft=trees[0].scheme.value,
        nodes=float(np.mean([tree.num_nodes for tree in trees])),
        median_ms=median,
        p90_ms=float(np.percentile(times_ms, 90)),
        mean_ms=float(times_ms.mean()),
        min_ms=float(times_ms.min()),
        mean_accepted_len=float(accepted.mean()),
        target_ms=target,
        status=status,
    )


def format_table(rows: list[Row]) -> str:
    header = f"{'rule':<16} {'draft':<19} {'nodes':>5} {'median ms':>10} {'p90 ms':>8} {'mean tau':>8} {'target':>7}  status"
    # median and p90 over interleaved repeats (rule order shuffled per repeat)
    lines = [header, "-" * len(header)]
    for row in rows:
        target = "-" if row.target_ms is None else f"{row.target_ms:g} ms"
        lines.append(
            f"{row.rule:<16} {row.draft:<19} {row.nodes:>5.1f} {row.median_ms:>10.3f} {row.p90_ms:>8.3f} "
            f"{row.mean_accepted_len:>8.2f} {target:>7}  {row.status}"
        )
    return "\n".join(lines)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--vocab", type=int, default=50_000, help="vocabulary size V")
    parser.add_argument("--num-drafts", type=int, default=4, help="K, drafts for the 'paths' rules")
    parser.add_argument("--draft-len", type=int, default=8, help="L, draft length")
    parser.add_argument("--repeats", type=int, default=200, help="timed verify calls per rule")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--num-trees", type=int, default=20, help="distinct pre-built trees, cycled over the repeats")
    parser.add_argument("--warmup", type=int, default=5, help="untimed verify calls per rule")
    parser.add_argument("--draft-noise", type=float, default=0.6, help="scale s of the model-specific logit noise")
    parser.add_argument("--rules", nargs="*", default=None, help="subset of rules (default: all of METHODS)")
    parser.add_argument(
        "--tree-variants", action="store_true", help="also time rrs / rrsw / nss / traversal on trees drawn with their tree_scheme"
    )
    parser.add_argument("--json", default=None, metavar="PATH", help="also write the rows as JSON")
    args = parser.parse_args(argv)
    for name in ("vocab", "num_drafts", "draft_len", "repeats", "num_trees"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    names = list(METHODS) if args.rules is None else args.rules
    unknown = [name for name in names if name not in METHODS]
    if unknown:
        print(f"unknown rules {unknown}; choose from {list(METHODS)}", file=sys.stderr)
        return 2
    print(
        f"verify speed: V={args.vocab} K={args.num_drafts} L={args.draft_len} repeats={args.repeats} "
        f"trees={args.num_trees} seed={args.seed} noise={args.draft_noise} | python {platform.python_version()} "
        f"numpy {np.__version__} | {platform.machine()}"
    )
    rows: list[Row] = []
    notes: list[str] = []
    jobs = []  # (label, spec, tree key = (draft kind, with SPRINTER accept probabilities))
    for name in names:
        spec = METHODS[name]
        if name in SKIPPED:
            notes.append(f"{name}: {SKIPPED[name]}")
            continue
        jobs.append((name, spec, (draft_kind(spec), name == "sprinter")))
    if args.tree_variants:
        for name in names:
            spec = METHODS[name]
            if name not in SKIPPED and spec.draft == "paths" and spec.tree_scheme is not None:
                jobs.append((f"{name}[tree]", spec, (f"tree:{spec.tree_scheme.value}", False)))
    trees_of: dict[tuple[str, bool], list[DraftTree]] = {}
    for _, _, key in jobs:
        if key not in trees_of:
            start = time.perf_counter()
            trees_of[key] = build_trees(key[0], args, with_sprinter_probs=key[1])
            print(f"  built {args.num_trees} '{key[0]}' trees in {time.perf_counter() - start:.1f} s", flush=True)
    runnable = []
    for job in jobs:  # a rule that fails is reported in the table and left out of the timing
        label, spec, key = job
        try:
            spec.verifier.verify(trees_of[key][0], SeededRng(0))
            runnable.append(job)
        except Exception as error:
            notes.append(f"{label}: ERROR {type(error).__name__}: {error}")
            rows.append(Row(label, key[0], float("nan"), *([float("nan")] * 5), TARGET_MS.get(spec.name), "ERROR"))
    timings = time_rules(runnable, trees_of, args.repeats, args.warmup, args.seed)
    for label, spec, key in runnable:
        rows.append(make_row(label, spec, trees_of[key], *timings[label]))
    rows.sort(key=lambda row: [label for label, _, _ in jobs].index(row.rule))
    print()
    print(format_table(rows))
    for note in notes:
        print(f"note: {note}")
    if "sprinter" in names:
        print(f"note: sprinter has no target; its verifier accepts each drafted token with probability {SPRINTER_ACCEPT}")
    if args.json:
        payload = {
            "settings": {k: v for k, v in vars(args).items() if k != "json"},
            "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
            "rows": [row.__dict__ for row in rows],
            "skipped": SKIPPED,
        }
        with open(args.json, "w") as handle:
            json.dump(payload, handle, indent=2)
        print(f"wrote {args.json}")
    return 0 if all(row.status not in ("FAIL", "ERROR") for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
