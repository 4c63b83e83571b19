"""The ``live`` stage of ``verispec compare``: each lossless rule at its best replayed point, decoded
live and interleaved per prompt with plain decoding, for tokens/s and the speedup."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from verispec.bench.compare.replaying import LOSSY, ReplayedRecording, by_point
from verispec.bench.replay import cluster_mean_ci95
from verispec.errors import ConfigError
from verispec.verify.registry import METHODS


@dataclass
class LiveBest:
    method: str
    point: str
    temperature: float
    replayed_be: float
    replayed_ci95: float
    live_be: float
    tokens_per_second: float
    plain_tokens_per_second: float
    speedup_median: float
    speedup_min: float
    speedup_max: float
    verify_ms_per_round: float
    draft_ms_per_round: float
    target_ms_per_round: float
    prompts: int


def best_points(replayed: list[ReplayedRecording], temperature: float) -> dict[str, ReplayedRecording]:
    """Per lossless rule, the head-draft point at ``temperature`` with the highest replayed BE."""
    best: dict[str, tuple[float, ReplayedRecording]] = {}
    for point in by_point(replayed).values():
        if point.meta.get("draft") != "head" or point.meta.get("temperature") != temperature:
            continue
        for method, values in point.values.items():
            if method in LOSSY:
                continue
            mean = cluster_mean_ci95(values, point.clusters)[0]
            if method not in best or mean > best[method][0]:
                best[method] = (mean, point)
    return {m: p for m, (_, p) in sorted(best.items())}


def run_live_best(replayed: list[ReplayedRecording], temperature: float, limit: int = 8, max_new_tokens: int = 32,
                  seed: int = 0, target=None, tokenizer=None, progress: bool = True) -> list[LiveBest]:
    """Each rule at its best point, live on HumanEval 0..limit-1, interleaved per prompt with plain
    decoding (rotating order, one process, the threads set by the caller): tokens/s and its ratio."""
    from verispec.bench.datasets import humaneval_prompts
    from verispec.bench.runner import prompt_seed
    from verispec.core.rng import SeededRng
    from verispec.engine.decoder import SpeculativeDecoder
    from verispec.models.default import encode_prompt

    if target is None:
        from verispec.models.default import load_default_target

        target, tokenizer = load_default_target()
    chosen = best_points(replayed, temperature)
    if not chosen:
        raise ConfigError(f"no head-draft recordings at T = {temperature:g} under the replay; record them first")
    decoders = {"plain": SpeculativeDecoder(target, None, tokenizer=tokenizer, method="ar", temperature=temperature,
                                            max_new_tokens=max_new_tokens)}
    not_run: dict[str, str] = {}
    for method, point in chosen.items():
        meta = point.meta
        # a chain rule's replay read path 0, a chain x ~ q: live it drafts that chain alone (K = 1)
        num_drafts = 1 if METHODS[method].draft == "chain" else meta["num_drafts"]
        try:
            decoders[method] = SpeculativeDecoder(
                target, "head", tokenizer=tokenizer, method=method, num_drafts=num_drafts, draft_len=meta["draft_len"],
                tree=list(meta["tree"]) if meta.get("tree") else None, temperature=temperature, max_new_tokens=max_new_tokens,
            )
        except ConfigError as error:  # e.g. qfree's live draft is the token tree, not sampled paths
            not_run[method] = str(error)
    chosen = {m: p for m, p in chosen.items() if m in decoders}
    prompts = humaneval_prompts(limit)
    outputs: dict[str, list] = {name: [] for name in decoders}
    names = list(decoders)
    for index, prompt in enumerate(prompts):
        ids = encode_prompt(tokenizer, prompt.text)
        shift = index % len(names)
        for name in names[shift:] + names[:shift]:  # rotate the order per prompt
            outputs[name].append(decoders[name].generate(ids, rng=SeededRng(prompt_seed(seed, index))))
        if progress:
            print(f"live prompt {index + 1}/{len(prompts)} done", flush=True)
    plain = outputs["plain"]
    rows = []
    for method, point in chosen.items():
        runs = outputs[method]
        ratios = np.array([(r.new_tokens / r.seconds) / (p.new_tokens / p.seconds) for r, p in zip(runs, plain)])
        calls = sum(r.target_calls for r in runs)
        parts = {k: sum(r.time_breakdown()[k] for r in runs) * 1e3 / max(calls, 1) for k in ("verify", "draft", "target")}
        mean, half, _ = cluster_mean_ci95(point.values[method], point.clusters)
        rows.append(LiveBest(
            method, point.label, temperature, mean, half, sum(r.new_tokens for r in runs) / max(calls, 1),
            sum(r.new_tokens for r in runs) / sum(r.seconds for r in runs),
            sum(p.new_tokens for p in plain) / sum(p.seconds for p in plain),
            float(np.median(ratios)), float(ratios.min()), float(ratios.max()),
            parts["verify"], parts["draft"], parts["target"], len(runs),
        ))
    for method, reason in not_run.items():
        if progress:
            print(f"{method} not run live at its best point: {reason}", flush=True)
    return rows


def live_best_markdown(rows: list[LiveBest]) -> str:
    lines = ["| rule | best point (replayed BE) | T | replayed BE | live BE | tok/s | plain tok/s | speedup median (min / max over prompts) | verify / draft / target ms per round |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in sorted(rows, key=lambda r: -r.speedup_median):
        lines.append(f"| {r.method} | {r.point} | {r.temperature:g} | {r.replayed_be:.3f} ± {r.replayed_ci95:.3f} | {r.live_be:.3f} | "
                     f"{r.tokens_per_second:.1f} | {r.plain_tokens_per_second:.1f} | {r.speedup_median:.2f}x "
                     f"({r.speedup_min:.2f} / {r.speedup_max:.2f}) | {r.verify_ms_per_round:.1f} / {r.draft_ms_per_round:.1f} / "
                     f"{r.target_ms_per_round:.1f} |")
    return "\n".join(lines) + "\n"
