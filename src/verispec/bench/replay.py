"""Record draft trees during a sweep and re-verify them with other rules (common random numbers).

Recording (``verispec bench --record``): the engine's ``step_callback`` hands every verified
``DraftTree`` (full float64 target vector of every node, draft vector of every internal node,
sampling scheme, raw paths) to a ``TreeRecorder``; the first ``record_limit`` rounds of each
configuration x dataset x temperature x seed are written to one compressed ``.npz`` file under
``OUT/trees/``, with the live run's accepted length of each round.

Replay (``verispec bench --replay DIR --methods ...``): every stored tree is verified by every
requested rule with ``tree_rng(seed, tree index, repeat)``, which does not depend on the rule, so
all rules see the same random numbers on the same tree (common random numbers): differences
between rules have far less variance than between independent runs. Replay block efficiency of
a tree = accepted_len + 1 (the tokens one target call would emit), averaged over ``repeats``
verifications of the tree. Rules whose
``supported_schemes`` exclude a tree's scheme are skipped, with the reason.

Caveats: a replay measures one round per tree on the recorded target vectors. Target
modifications that GBV-mod / SpecTr-GBV★ carry into *later* rounds are not replayed, and trees
recorded from those rules hold the (modified) target vectors they were verified with.
"""

from __future__ import annotations

import csv
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from verispec.core.rng import SeededRng
from verispec.core.tree import DraftScheme, DraftTree
from verispec.errors import ConfigError, VerispecError
from verispec.verify.registry import get_method

TREES_DIR = "trees"
Z95 = 1.959963984540054


@dataclass
class TreeRecorder:
    """Collects the first ``limit`` verified trees of one configuration run (all its prompts)."""

    limit: int
    trees: list[DraftTree] = field(default_factory=list)
    live_accepted_lens: list[int] = field(default_factory=list)
    prompt_ids: list[str] = field(default_factory=list)
    current_prompt: str = ""

    def callback(self, tree: DraftTree, result, step) -> None:
        """The engine's step_callback(tree, result, step)."""
        if len(self.trees) < self.limit:
            self.trees.append(tree)
            self.live_accepted_lens.append(int(result.accepted_len))
            self.prompt_ids.append(self.current_prompt)

    def save(self, path: Path, meta: dict) -> Path | None:
        if not self.trees:
            return None
        save_trees(path, self.trees, self.live_accepted_lens, self.prompt_ids, meta)
        return path


def save_trees(path: Path, trees, live_accepted_lens, prompt_ids, meta: dict) -> None:
    """One compressed npz: the trees' nodes concatenated (offsets per tree), raw paths flattened."""
    path.parent.mkdir(parents=True, exist_ok=True)
    node_counts = [tree.num_nodes for tree in trees]
    paths = [path_ for tree in trees for path_ in tree.paths]
    np.savez_compressed(
        path,
        meta=np.array(json.dumps(meta)),
        node_offsets=np.concatenate([[0], np.cumsum(node_counts)]).astype(np.int64),
        tokens=np.concatenate([tree.tokens for tree in trees]),
        parents=np.concatenate([tree.parents for tree in trees]),
        target_probs=np.concatenate([tree.target_probs for tree in trees]),
        draft_probs=np.concatenate([tree.draft_probs for tree in trees]),
        schemes=np.array([tree.scheme.value for tree in trees]),
        paths_per_tree=np.array([tree.num_paths for tree in trees], dtype=np.int64),
        path_lengths=np.array([len(p) for p in paths], dtype=np.int64),
        path_nodes=np.array([node for p in paths for node in p], dtype=np.int64),
        live_accepted_lens=np.array(live_accepted_lens, dtype=np.int64),
        prompt_ids=np.array(prompt_ids),
    )


@dataclass
class RecordedTrees:
    """The trees of one recorded configuration, with the live run's accepted lengths."""

    path: Path
    meta: dict
    trees: list[DraftTree]
    live_accepted_lens: list[int]
    prompt_ids: list[str]

    @property
    def source(self) -> str:
        return self.meta.get("label", self.path.stem)


def load_trees(path: str | Path) -> RecordedTrees:
    path = Path(path)
    with np.load(path, allow_pickle=False) as data:
        offsets = data["node_offsets"]
        path_lengths, path_nodes = data["path_lengths"], data["path_nodes"]
        path_starts = np.concatenate([[0], np.cumsum(path_lengths)])
        trees, path_index = [], 0
        for index, scheme in enumerate(data["schemes"]):
            lo, hi = int(offsets[index]), int(offsets[index + 1])
            paths = []
            for _ in range(int(data["paths_per_tree"][index])):
                paths.append(tuple(int(n) for n in path_nodes[path_starts[path_index]:path_starts[path_index + 1]]))
                path_index += 1
            trees.append(DraftTree.build(
                data["tokens"][lo:hi], data["parents"][lo:hi], data["target_probs"][lo:hi],
                data["draft_probs"][lo:hi], DraftScheme(str(scheme)), paths=paths, validate=False,
            ))
        return RecordedTrees(
            path, json.loads(str(data["meta"])), trees,
            [int(t) for t in data["live_accepted_lens"]], [str(p) for p in data["prompt_ids"]],
        )


def find_recordings(directory: str | Path) -> list[Path]:
    """The .npz recordings under DIR/trees (or DIR itself)."""
    directory = Path(directory)
    if not directory.is_dir():
        raise ConfigError(f"replay directory {str(directory)!r} not found; give the --out folder of a --record run")
    files = sorted((directory / TREES_DIR).glob("*.npz")) or sorted(directory.glob("*.npz"))
    if not files:
        raise ConfigError(f"no recorded trees (*.npz) in {directory} or {directory / TREES_DIR}; run verispec bench --record first")
    return files


def mean_ci95(values) -> tuple[float, float]:
    """Mean and half-width of its normal-approximation 95% confidence interval."""
    values = np.asarray(values, dtype=np.float64)
    if values.size == 0:
        return math.nan, math.nan
    if values.size == 1:
        return float(values[0]), math.nan
    return float(values.mean()), float(Z95 * values.std(ddof=1) / math.sqrt(values.size))


@dataclass
class ReplayStat:
    """BE = accepted_len + 1 of one rule over the trees of one recording.

    diff_vs_reference: paired mean (and CI) of this rule's BE minus the reference rule's (the
    first replayed rule) on the same trees with the same random numbers."""

    source: str
    method: str
    num_trees: int
    block_efficiency: float
    ci95: float
    std: float
    reference: str
    diff_vs_reference: float
    diff_ci95: float
    per_tree: list[float] = field(default_factory=list, repr=False)


@dataclass
class ReplayReport:
    stats: list[ReplayStat]
    skipped: list[tuple[str, str, str]]  # (source, method, reason)
    live: dict[str, tuple[float, float, int]]  # source -> (mean live BE, ci95, trees)
    methods: list[str]

    def to_dict(self) -> dict:
        return {
            "definition": "replay BE per tree = accepted_len + 1; ± = 95% CI (normal approximation); "
            "common random numbers: the same SeededRng((seed, tree index, repeat)) for every rule",
            "stats": [{k: v for k, v in stat.__dict__.items() if k != "per_tree"} for stat in self.stats],
            "skipped": [{"source": s, "method": m, "reason": r} for s, m, r in self.skipped],
            "live": {s: {"block_efficiency": m, "ci95": c, "num_trees": n} for s, (m, c, n) in self.live.items()},
        }


def tree_rng(seed: int, index: int, repeat: int = 0) -> SeededRng:
    """The Rng of tree ``index`` (and repeat): the same for every rule (common random numbers)."""
    return SeededRng(np.random.default_rng([int(seed), int(index), int(repeat)]))


def replay_recording(recording: RecordedTrees, methods: list[str], seed: int = 0, repeats: int = 1):
    """(stats, skipped) of every rule in ``methods`` on one recording. Each tree's BE is the mean
    of accepted_len + 1 over ``repeats`` verifications with independent common random numbers."""
    per_rule: dict[str, list[int]] = {}
    skipped: list[tuple[str, str, str]] = []
    for method in methods:
        verifier = get_method(method).verifier
        schemes = {tree.scheme for tree in recording.trees}
        unsupported = schemes - set(verifier.supported_schemes)
        if unsupported:
            allowed = ", ".join(sorted(s.value for s in verifier.supported_schemes))
            skipped.append((recording.source, method, f"recorded scheme {', '.join(sorted(s.value for s in unsupported))} "
                            f"is not among {method}'s supported schemes ({allowed})"))
            continue
        try:
            per_rule[method] = [
                float(np.mean([verifier.verify(tree, tree_rng(seed, index, r)).accepted_len + 1 for r in range(repeats)]))
                for index, tree in enumerate(recording.trees)
            ]
        except VerispecError as error:
            skipped.append((recording.source, method, f"{type(error).__name__}: {error}"))
    stats = []
    reference = next(iter(per_rule), None)
    for method, values in per_rule.items():
        mean, ci = mean_ci95(values)
        diff, diff_ci = mean_ci95(np.asarray(values) - np.asarray(per_rule[reference]))
        stats.append(ReplayStat(
            recording.source, method, len(values), mean, ci,
            float(np.std(values, ddof=1)) if len(values) > 1 else 0.0,
            reference, diff, diff_ci, list(values),
        ))
    return stats, skipped


def replay(directory: str | Path, methods: list[str], seed: int = 0, repeats: int = 1) -> ReplayReport:
    """Re-verify every tree recorded under ``directory`` with every rule in ``methods``."""
    if repeats < 1:
        raise ConfigError(f"replay repeats must be >= 1, got {repeats}")
    if not methods:
        raise ConfigError("replay needs --methods, e.g. --methods sd,bv,gbv-mod")
    for method in methods:
        get_method(method)
    stats, skipped, live = [], [], {}
    for path in find_recordings(directory):
        recording = load_trees(path)
        rule_stats, rule_skipped = replay_recording(recording, methods, seed, repeats)
        stats.extend(rule_stats)
        skipped.extend(rule_skipped)
        mean, ci = mean_ci95([tau + 1 for tau in recording.live_accepted_lens])
        live[recording.source] = (mean, ci, len(recording.trees))
    return ReplayReport(stats, skipped, live, list(methods))


def replay_markdown(report: ReplayReport) -> str:
    """Sources as rows, rules as columns: mean replay BE ± 95% CI, and the paired difference
    against the first rule."""
    lines = [
        "# verispec replay",
        "",
        "Replay BE per tree = accepted_len + 1; ± = 95% CI. Every rule verifies the same recorded "
        "trees with the same random numbers (SeededRng((seed, tree index, repeat))); Δ = paired "
        "difference against the first rule, ± its 95% CI. 'live' = the recorded run's own rounds.",
        "",
    ]
    methods = [m for m in report.methods if any(s.method == m for s in report.stats)]
    header = ["source", "trees", "live BE", *methods, *[f"Δ {m} − {methods[0]}" for m in methods[1:]]]
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    by_source: dict[str, dict[str, ReplayStat]] = {}
    for stat in report.stats:
        by_source.setdefault(stat.source, {})[stat.method] = stat
    for source, (live_mean, live_ci, trees) in report.live.items():
        cells = [source, str(trees), f"{live_mean:.3f} ± {live_ci:.3f}"]
        stats = by_source.get(source, {})
        cells += [f"{stats[m].block_efficiency:.3f} ± {stats[m].ci95:.3f}" if m in stats else "skipped" for m in methods]
        cells += [
            f"{stats[m].diff_vs_reference:+.3f} ± {stats[m].diff_ci95:.3f}" if m in stats and stats[m].reference == methods[0] else "–"
            for m in methods[1:]
        ]
        lines.append("| " + " | ".join(cells) + " |")
    if report.skipped:
        lines += ["", "Skipped:", ""]
        lines += [f"- {method} on {source}: {reason}" for source, method, reason in report.skipped]
    return "\n".join(lines) + "\n"


def write_replay(report: ReplayReport, out_dir: str | Path) -> dict[str, Path]:
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {"md": out_dir / "replay.md", "json": out_dir / "replay.json", "csv": out_dir / "replay.csv"}
    paths["md"].write_text(replay_markdown(report))
    paths["json"].write_text(json.dumps(report.to_dict(), indent=1))
    columns = ["source", "method", "num_trees", "block_efficiency", "ci95", "std", "reference", "diff_vs_reference", "diff_ci95"]
    with paths["csv"].open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(columns)
        writer.writerows([getattr(stat, c) for c in columns] for stat in report.stats)
    return paths
