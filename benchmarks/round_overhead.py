"""Per-round verification overhead before and after the lazy row providers (``core.rows``).

Usage:
    python benchmarks/round_overhead.py --json FILE [--vocab 49152 128256 151936]
        [--nodes 5 17 33 65] [--rules sd bv ...] [--repeats 11] [--trees 3] [--seed 0]

The overhead of a round is everything between the models' logits and the next round except the
forwards and the draft's own sampling: target logits processing, building the tree, verification
and the commit bookkeeping (the accepted path). Two variants run side by side in one process,
interleaved (before, after, before, after, ... on the same trees and the same random numbers):

  before  today's dense path: ``logits_to_probs`` on every target row (float64 (n, V)), the
          draft rows stacked into a dense (n, V) matrix, the rule on ``DenseRows``
  after   ``LogitRows`` over the raw target logits (processed only where the rule reads them),
          the draft rows the sampler drew from kept per node (``NodeRows``), the same rule code

draft_ms is the draft's own sampling (rows from the draft logits with ``logits_to_probs`` per
tree level, as ``ModelDrafter`` does, and the sampler's draws), reported beside, not included.

Synthetic logits (no network; V is too large for a toy model): per drafted prefix z,
    target logits 3 g_z + 0.6 e_z,   draft logits 3 g_z + 0.6 e'_z
with g_z, e_z, e'_z standard normal rows (float32, the models' dtype), so both are peaked and
sum_x min(p, q) ~ 0.7 per position at T = 1. Tree shapes for n nodes:
    chain rules (sd, bv)               a chain of n - 1 tokens
    path rules (spectr, gmpbv, SpecTr-GBV★)  K i.i.d. paths with K x L = n - 1 (their trie)
    tree rules (nss, traversal, rrsw)  [K, 1, ..., 1] without replacement, K = 4 (8 at n = 65)
    rrs                                the same shape with i.i.d. children
    spechub                            [2, 1, ..., 1] SpecHub pairs
    qfree                              a DETERMINISTIC candidate tree of the same [K, 1, ..., 1]
                                       shape: the draft's top-K tokens at the root, then the draft's
                                       argmax chain under each (as the token-tree drafter's
                                       adjacency top-k; nothing sampled, q never read)
Times: torch and BLAS at 1 thread, garbage collector paused, median and p90 over
--repeats x --trees rounds per cell.

    python benchmarks/round_overhead.py --row-cost --json FILE [--vocab ...] [--repeats 5]

measures instead the cost of ONE touched target row (the unit the lazy rows pay per row a rule
visits), interleaved per row over the rows of the synthetic bank (--nodes max of them):
  before  ``logits_to_probs`` of that row alone (the dense path's per-row work)
  entry   a fresh ``LogitRows`` and probs_of of one token there (the acceptance tests' read)
  support a fresh ``LogitRows`` and support() of the row (what a residual or a draw reads)
  floor   the bare torch passes every such read needs at least: the row's max, then one
          exp2((x - max) log2(e) / T) pass and its sum (no nucleus, no candidates). A rule that
          must read every row (BV with all drafts accepted, traversal) pays at least rows x floor,
          whatever the implementation.
Records: {"measure", "vocab", "temperature", "top_p", "median_ms", "p90_ms", "rows"}.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402

from verispec.core.rng import SeededRng  # noqa: E402
from verispec.core.rows import LogitRows, NodeRows  # noqa: E402
from verispec.core.sampling import SamplingParams, logits_to_probs  # noqa: E402
from verispec.core.tree import DraftScheme, DraftTree  # noqa: E402
from verispec.draft.samplers import DraftSkeleton, sample_iid_paths, sample_tree  # noqa: E402
from verispec.verify.registry import get_method  # noqa: E402

DEFAULT_RULES = ["sd", "bv", "nss", "traversal", "rrsw", "rrs", "spechub", "qfree", "spectr", "gmpbv", "spectr-gbv-star"]
SINGLE_PASS_GOAL_MS = 3.0  # at V = 128,256 and 33 nodes: the budget the lazy rows were built to meet
MULTI_GOAL_MS = 10.0
GOALS = {**{r: SINGLE_PASS_GOAL_MS for r in ("sd", "bv", "nss", "traversal", "rrsw", "rrs", "spechub", "qfree")},
         **{r: MULTI_GOAL_MS for r in ("spectr", "gmpbv", "spectr-gbv-star")}}
SAMPLING = [SamplingParams(0.0), SamplingParams(0.6, top_p=0.95)]
NOISE = 0.6


class LogitBank:
    """Synthetic target and draft logits, one row per distinct drafted prefix."""

    def __init__(self, vocab: int, rows: int, seed: int):
        generator = torch.Generator().manual_seed(seed)
        shared = torch.randn(rows, vocab, generator=generator) * 3.0
        self.target = shared + NOISE * torch.randn(rows, vocab, generator=generator)
        self.draft = shared + NOISE * torch.randn(rows, vocab, generator=generator)
        self.index: dict[tuple[int, ...], int] = {}

    def row_of(self, prefix) -> int:
        return self.index.setdefault(tuple(prefix), len(self.index) % self.target.shape[0])


class DraftFn:
    """q rows as ``ModelDrafter`` makes them: one ``logits_to_probs`` per tree level."""

    def __init__(self, bank: LogitBank, params: SamplingParams):
        self.bank, self.params = bank, params

    def batch_probs(self, prefixes):
        rows = [self.bank.row_of(p) for p in prefixes]
        return list(logits_to_probs(self.bank.draft[rows], self.params))

    def __call__(self, prefix):
        return self.batch_probs([prefix])[0]


def tree_width(nodes: int) -> int:
    return 4 if nodes <= 33 else 8


def deterministic_skeleton(nodes: int, bank: LogitBank) -> DraftSkeleton:
    """qfree's candidate tree (DraftScheme.DETERMINISTIC): the top-K draft tokens at the root,
    then under each the draft's argmax chain, K x depth // K nodes below the root. Chosen by a
    rule, not sampled, so it has no q: the draft rows are all zero."""
    width = tree_width(nodes)
    tokens, parents, prefixes = [-1], [-1], [()]

    def add(parent: int, token: int) -> int:
        tokens.append(int(token))
        parents.append(parent)
        prefixes.append(prefixes[parent] + (int(token),))
        return len(tokens) - 1

    for token in torch.topk(bank.draft[bank.row_of(())], width).indices.tolist():
        node = add(0, token)
        for _ in range((nodes - 1) // width - 1):
            node = add(node, int(bank.draft[bank.row_of(prefixes[node])].argmax()))
    vocab = bank.draft.shape[1]
    return DraftSkeleton(tuple(tokens), tuple(parents), NodeRows({}, len(tokens), vocab), DraftScheme.DETERMINISTIC,
                         (), tuple(prefixes))


def draw_skeleton(rule: str, nodes: int, rng, draft_fn):
    spec = get_method(rule)
    depth = nodes - 1
    if spec.tree_scheme is DraftScheme.DETERMINISTIC:
        return deterministic_skeleton(nodes, draft_fn.bank)
    if spec.draft == "chain":
        return sample_iid_paths(rng, draft_fn, 1, depth)
    if spec.draft == "paths":
        num_drafts = 2 if depth <= 4 else 4 if depth <= 32 else 8
        return sample_iid_paths(rng, draft_fn, num_drafts, depth // num_drafts)
    if rule == "spechub":
        return sample_tree(rng, draft_fn, [2] + [1] * (depth // 2 - 1), DraftScheme.SPECHUB_PAIR)
    width = tree_width(nodes)
    scheme = DraftScheme.IID_TREE if rule == "rrs" else DraftScheme.WITHOUT_REPLACEMENT
    return sample_tree(rng, draft_fn, [width] + [1] * (depth // width - 1), scheme)


def before(skeleton, target_logits, params, verifier, rng):
    probs = logits_to_probs(target_logits, params)
    draft = np.zeros((skeleton.num_nodes, target_logits.shape[1]))
    for node, row in skeleton.draft.rows.items():
        draft[node] = row
    tree = DraftTree.build(skeleton.tokens, skeleton.parents, probs, draft, skeleton.scheme, skeleton.paths, validate=False)
    result = verifier.verify(tree, rng)
    return tree.path_to(result.accepted_node), result


def after(skeleton, target_logits, params, verifier, rng):
    tree = skeleton.with_target(LogitRows(target_logits, params), validate=False)
    result = verifier.verify(tree, rng)
    return tree.path_to(result.accepted_node), result


def measure(rule, vocab, nodes, params, bank, repeats, num_trees, seed):
    verifier = get_method(rule).verifier
    trees, draft_times = [], []
    for t in range(num_trees):
        bank.index.clear()
        tic = time.perf_counter()
        skeleton = draw_skeleton(rule, nodes, SeededRng(seed + t), DraftFn(bank, params))
        draft_times.append(time.perf_counter() - tic)
        logits = bank.target[[bank.row_of(p) for p in skeleton.prefixes]].contiguous()
        trees.append((skeleton, logits))
    times = {"before": [], "after": []}
    outputs_agree = True
    gc.disable()
    try:
        for repeat in range(repeats):
            for t, (skeleton, logits) in enumerate(trees):
                results = {}
                for name, fn in (("before", before), ("after", after)) if repeat % 2 == 0 else (("after", after), ("before", before)):
                    rng = SeededRng(1000 * repeat + t)
                    tic = time.perf_counter()
                    _, result = fn(skeleton, logits, params, verifier, rng)
                    times[name].append(time.perf_counter() - tic)
                    results[name] = result.output_tokens
                outputs_agree &= results["before"] == results["after"]
    finally:
        gc.enable()
    records = []
    for name in ("before", "after"):
        ms = np.array(times[name]) * 1e3
        records.append({
            "rule": rule, "variant": name, "vocab": vocab, "nodes": int(np.mean([s.num_nodes for s, _ in trees])),
            "requested_nodes": nodes, "temperature": params.temperature, "top_p": params.top_p,
            "median_ms": float(np.median(ms)), "p90_ms": float(np.percentile(ms, 90)),
            "draft_ms": float(np.median(draft_times) * 1e3), "rounds": len(ms),
            "outputs_agree": bool(outputs_agree),
        })
    return records


def _mass_floor(row: torch.Tensor, temperature: float) -> float:
    """max pass + one exp2 pass + sum: the least any normaliser of a row costs (see --row-cost)."""
    scale = 1.4426950408889634 / (temperature if temperature > 0 else 1.0)
    return float((row - row.max()).mul_(scale).exp2_().sum())


def measure_row_cost(vocab: int, rows: int, params: SamplingParams, repeats: int, seed: int) -> list[dict]:
    bank = LogitBank(vocab, rows, seed)
    logits = bank.target
    variants = {
        "before": lambda i: logits_to_probs(logits[i : i + 1], params),
        "entry": lambda i: LogitRows(logits, params).probs_of([i], [i]),
        "support": lambda i: LogitRows(logits, params).support(i),
        "floor": lambda i: _mass_floor(logits[i], params.temperature),
    }
    times = {name: [] for name in variants}
    names = list(variants)
    gc.disable()
    try:
        for repeat in range(repeats):
            for i in range(rows):
                shift = (repeat + i) % len(names)  # rotate the order per row
                for name in names[shift:] + names[:shift]:
                    tic = time.perf_counter()
                    variants[name](i)
                    times[name].append(time.perf_counter() - tic)
    finally:
        gc.enable()
    return [{"measure": name, "vocab": vocab, "temperature": params.temperature, "top_p": params.top_p,
             "median_ms": float(np.median(np.array(ms) * 1e3)), "p90_ms": float(np.percentile(np.array(ms) * 1e3, 90)),
             "rows": len(ms)} for name, ms in times.items()]


def row_cost_main(args) -> None:
    print(f"# {platform.processor() or platform.machine()}, torch {torch.__version__}, 1 thread; ms per touched "
          f"target row, median (p90) over {args.repeats} x {max(args.nodes)} rows, variants interleaved")
    header = f"{'V':>7} {'T':>4} {'top_p':>5} | {'before':>14} | {'entry':>14} | {'support':>14} | {'floor':>14}"
    print(header)
    print("-" * len(header))
    records = []
    for vocab in args.vocab:
        for params in SAMPLING:
            cell = measure_row_cost(vocab, max(args.nodes), params, args.repeats, args.seed)
            records.extend(cell)
            cols = " | ".join(f"{r['median_ms']:6.3f} ({r['p90_ms']:5.3f})" for r in cell)
            print(f"{vocab:7d} {params.temperature:4g} {params.top_p:5g} | {cols}", flush=True)
    with open(args.json, "w") as handle:
        json.dump(records, handle, indent=1)
    print(f"wrote {len(records)} records to {args.json}")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", required=True, help="write the records to this JSON file")
    parser.add_argument("--vocab", type=int, nargs="+", default=[49152, 128256, 151936])
    parser.add_argument("--nodes", type=int, nargs="+", default=[5, 17, 33, 65])
    parser.add_argument("--rules", nargs="+", default=DEFAULT_RULES)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--trees", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--row-cost", action="store_true", help="measure one touched target row instead of rounds")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    if args.row_cost:
        row_cost_main(args)
        return
    print(f"# {platform.processor() or platform.machine()}, torch {torch.__version__}, 1 thread; "
          f"median / p90 ms per round over {args.repeats} x {args.trees} rounds, before/after interleaved")
    header = f"{'rule':16} {'V':>7} {'n':>3} {'T':>4} {'top_p':>5} | {'before med':>10} {'p90':>7} | {'after med':>9} {'p90':>7} | {'x':>6} | {'draft':>7} | goal"
    print(header)
    print("-" * len(header))
    records = []
    for vocab in args.vocab:
        bank = LogitBank(vocab, max(args.nodes) + 1, args.seed)
        for nodes in args.nodes:
            for params in SAMPLING:
                for rule in args.rules:
                    pair = measure(rule, vocab, nodes, params, bank, args.repeats, args.trees, args.seed)
                    records.extend(pair)
                    old, new = pair
                    goal = ""
                    if vocab == 128256 and nodes == 33 and rule in GOALS:
                        goal = f"< {GOALS[rule]:g} ms: {'PASS' if new['median_ms'] < GOALS[rule] else 'MISS'}"
                    if vocab == 49152 and nodes == 5 and rule == "sd":
                        goal = f"< 0.5 ms: {'PASS' if new['median_ms'] < 0.5 else 'MISS'}"
                    if not new["outputs_agree"]:
                        goal += " (outputs differ)"
                    print(f"{rule:16} {vocab:7d} {new['nodes']:3d} {params.temperature:4g} {params.top_p:5g} | "
                          f"{old['median_ms']:10.2f} {old['p90_ms']:7.2f} | {new['median_ms']:9.2f} {new['p90_ms']:7.2f} | "
                          f"{old['median_ms'] / new['median_ms']:6.1f} | {new['draft_ms']:7.1f} | {goal}", flush=True)
                    with open(args.json, "w") as handle:  # after every cell: a long run keeps what it measured
                        json.dump(records, handle, indent=1)
        del bank
    with open(args.json, "w") as handle:
        json.dump(records, handle, indent=1)
    print(f"wrote {len(records)} records to {args.json}")


if __name__ == "__main__":
    main()
