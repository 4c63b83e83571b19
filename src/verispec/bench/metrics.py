"""Benchmark metrics, one definition each (DESIGN.md §5).

Per configuration (method, K, L, temperature on one dataset or category) and seed, over the
prompts it decoded (pooled: ratios of totals, so long generations weigh more than short ones):

- block efficiency  BE = sum new tokens / sum target forward calls during decoding (prefill
  excluded: it is reported separately as ``prefill_seconds``).
- mean accepted length = mean tau over all speculative rounds (tau = draft tokens kept per
  round); it equals BE - 1 except that the last round of a prompt may be cut at EOS or
  max_new_tokens.
- acceptance rate = mean tau / L.
- per-position acceptance a_i = #rounds with tau >= i / #rounds with tau >= i-1, i = 1..L.
- alpha = sum tau / sum min(tau + 1, L): the fraction of the examined draft positions that was
  accepted (the maximum-likelihood constant acceptance rate of the geometric model).
- predicted BE: 1 + sum_i prod_{j<=i} a_j (from the per-position rates) and
  (1 - alpha^(L+1)) / (1 - alpha) (from alpha), ``verispec.theory.closed_forms``.
- walltime per token = sum seconds / sum new tokens (seconds = whole ``generate`` call,
  prefill included); tokens/s = its inverse.
- speedup SR = (ar_seconds / ar_tokens) / (method_seconds / method_tokens): walltime per token
  of plain autoregressive sampling ('ar', same target, prompts, max_new_tokens, sampling
  parameters and seed, measured in the same run) over the method's walltime per token.
- time breakdown: draft, target, verify and other seconds summed over the decoding rounds,
  as fractions of their sum.

Spread: with two or more seeds, each figure is the mean over seeds of the per-seed pooled value
and ``*_std`` the sample standard deviation over seeds; with one seed, the figure is the pooled
value and ``*_std`` the standard deviation over prompts (each prompt's own value).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field

import numpy as np

from verispec.theory.closed_forms import block_efficiency_from_positions, expected_block_efficiency

BASELINE = "ar"
ALL_CATEGORIES = "all"
BREAKDOWN_PARTS = ("draft", "target", "verify", "other")
NAN = float("nan")

DEFINITIONS = [
    ("BE", "block efficiency: tokens emitted / target forward calls during decoding (prefill excluded)"),
    ("SR", "speedup: (ar seconds / ar tokens) / (method seconds / method tokens), plain autoregressive "
     "sampling of the same target on the same prompts, max_new_tokens, sampling parameters and seeds, same run"),
    ("mean accepted length", "mean draft tokens kept per round (= BE - 1 up to the last round's cut at EOS / max_new_tokens)"),
    ("acceptance rate", "mean accepted length / L"),
    ("per-position acceptance", "a_i = P(tau >= i | tau >= i-1), i = 1..L, over all rounds"),
    ("alpha", "accepted draft tokens / examined draft positions = sum tau / sum min(tau+1, L)"),
    ("predicted BE", "1 + sum_i prod_{j<=i} a_j from the per-position rates; 'BE(alpha)' = (1-alpha^(L+1))/(1-alpha)"),
    ("tokens/s, s/token", "new tokens / walltime of generate (prefill included), pooled over prompts"),
    ("breakdown", "draft / target / verify / other seconds of the decoding rounds, as fractions of their sum"),
    ("±", "sample std over seeds (>= 2 seeds) or over prompts (1 seed)"),
]


@dataclass
class PromptRecord:
    """One prompt decoded by one configuration with one seed: one line of records.jsonl.

    K, L are 0 for configurations without a draft (the 'ar' baseline, 'hf-generate');
    accepted_lens holds tau of every speculative round (empty when rounds are unknown or absent);
    *_seconds of the decoding rounds are NaN when not measured (transformers' generate).
    """

    dataset: str
    category: str
    prompt_id: str
    method: str
    K: int
    L: int
    temperature: float
    seed: int
    prompt_tokens: int
    new_tokens: int
    target_calls: int
    seconds: float
    prefill_seconds: float = 0.0
    draft_calls: int = 0
    accepted_lens: list[int] = field(default_factory=list)
    draft_seconds: float = NAN
    target_seconds: float = NAN
    verify_seconds: float = NAN
    other_seconds: float = NAN
    stop_reason: str = ""
    text: str = ""

    @classmethod
    def from_output(cls, output, dataset: str, category: str, prompt_id: str, temperature: float, seed: int) -> "PromptRecord":
        """From an engine ``GenerationOutput`` (verispec.engine.decoder)."""
        speculative = output.method != BASELINE
        breakdown = output.time_breakdown()
        return cls(
            dataset=dataset,
            category=category,
            prompt_id=str(prompt_id),
            method=output.method,
            K=output.num_drafts if speculative else 0,
            L=output.draft_len if speculative else 0,
            temperature=float(temperature),
            seed=int(seed),
            prompt_tokens=len(output.prompt_ids),
            new_tokens=output.new_tokens,
            target_calls=output.target_calls,
            seconds=output.seconds,
            prefill_seconds=output.prefill_seconds,
            draft_calls=output.draft_calls,
            accepted_lens=[step.accepted_len for step in output.steps] if speculative else [],
            draft_seconds=breakdown["draft"],
            target_seconds=breakdown["target"],
            verify_seconds=breakdown["verify"],
            other_seconds=breakdown["other"],
            stop_reason=output.stop_reason,
            text=output.text,
        )

    @property
    def config_key(self) -> tuple:
        return (self.method, self.K, self.L, self.temperature)

    @property
    def block_efficiency(self) -> float:
        return self.new_tokens / self.target_calls if self.target_calls else NAN

    def to_json(self) -> dict:
        """Flat fields, this prompt's own metrics, and Spec-Bench's answer layout ('choices')."""
        metrics = pool([self])
        record = asdict(self)
        record.update(
            question_id=self.prompt_id,
            model_id=config_label(self.method, self.K, self.L, self.temperature),
            block_efficiency=metrics.block_efficiency,
            mean_accepted_len=metrics.mean_accepted_len,
            acceptance_rate=metrics.acceptance_rate,
            position_acceptance=list(metrics.position_acceptance),
            tokens_per_second=metrics.tokens_per_second,
            choices=[{
                "index": 0,
                "turns": [self.text],
                "decoding_steps": [self.target_calls],
                "new_tokens": [self.new_tokens],
                "wall_time": [self.seconds],
                "accept_lengths": [tau + 1 for tau in self.accepted_lens],
            }],
        )
        return record

    @classmethod
    def from_json(cls, record: dict) -> "PromptRecord":
        names = cls.__dataclass_fields__
        values = {key: value for key, value in record.items() if key in names}
        for key in ("draft_seconds", "target_seconds", "verify_seconds", "other_seconds"):
            if values.get(key) is None:
                values[key] = NAN
        return cls(**values)


def config_label(method: str, num_drafts: int, draft_len: int, temperature: float) -> str:
    if not draft_len:
        return f"{method}-T{temperature:g}"
    return f"{method}-K{num_drafts}-L{draft_len}-T{temperature:g}"


@dataclass(frozen=True)
class PooledMetrics:
    """Metrics of a group of prompt records pooled as ratios of totals (module docstring)."""

    num_prompts: int
    new_tokens: int
    target_calls: int
    rounds: int
    seconds: float
    prefill_seconds: float
    block_efficiency: float
    mean_accepted_len: float
    acceptance_rate: float
    alpha: float
    position_acceptance: tuple[float, ...]
    seconds_per_token: float
    tokens_per_second: float
    breakdown: dict[str, float]  # fractions of the decoding rounds' time

    @property
    def predicted_block_efficiency(self) -> float:
        """1 + sum_i prod_{j<=i} a_j from the measured per-position acceptance (positions behind a
        rate of 0 were never reached: their NaN rates do not matter)."""
        rates = []
        for rate in self.position_acceptance:
            if math.isnan(rate):
                return NAN
            rates.append(rate)
            if rate == 0.0:
                break
        return block_efficiency_from_positions(rates) if rates else NAN

    @property
    def predicted_block_efficiency_alpha(self) -> float:
        """(1 - alpha^(L+1)) / (1 - alpha) with L = len(position_acceptance)."""
        if math.isnan(self.alpha) or not self.position_acceptance:
            return NAN
        return expected_block_efficiency(self.alpha, len(self.position_acceptance))


def _ratio(numerator: float, denominator: float) -> float:
    return numerator / denominator if denominator else NAN


def position_acceptance(accepted_lens: Sequence[int], draft_len: int) -> tuple[float, ...]:
    """a_i = #(tau >= i) / #(tau >= i-1), i = 1..L (NaN where no round reached position i)."""
    taus = np.asarray(accepted_lens, dtype=np.int64)
    return tuple(_ratio(float((taus >= i).sum()), float((taus >= i - 1).sum())) for i in range(1, draft_len + 1))


def pool(records: Sequence[PromptRecord]) -> PooledMetrics:
    """Pooled metrics of records of ONE configuration (same L)."""
    draft_len = records[0].L if records else 0
    taus = [tau for record in records for tau in record.accepted_lens]
    new_tokens = sum(r.new_tokens for r in records)
    target_calls = sum(r.target_calls for r in records)
    seconds = float(sum(r.seconds for r in records))
    parts = {part: float(sum(getattr(r, f"{part}_seconds") for r in records)) for part in BREAKDOWN_PARTS}
    parts_total = sum(parts.values())
    has_rounds = bool(taus) and draft_len > 0
    mean_tau = float(np.mean(taus)) if has_rounds else NAN
    examined = sum(min(tau + 1, draft_len) for tau in taus)
    return PooledMetrics(
        num_prompts=len(records),
        new_tokens=new_tokens,
        target_calls=target_calls,
        rounds=len(taus),
        seconds=seconds,
        prefill_seconds=float(sum(r.prefill_seconds for r in records)),
        block_efficiency=_ratio(new_tokens, target_calls),
        mean_accepted_len=mean_tau,
        acceptance_rate=mean_tau / draft_len if has_rounds else NAN,
        alpha=_ratio(sum(taus), examined) if has_rounds else NAN,
        position_acceptance=position_acceptance(taus, draft_len) if has_rounds else (),
        seconds_per_token=_ratio(seconds, new_tokens),
        tokens_per_second=_ratio(new_tokens, seconds),
        breakdown={part: _ratio(value, parts_total) for part, value in parts.items()},
    )


def speedup(method: PooledMetrics, baseline: PooledMetrics | None) -> float:
    """SR = baseline walltime per token / method walltime per token."""
    if baseline is None:
        return NAN
    return _ratio(baseline.seconds_per_token, method.seconds_per_token)


def mean_std(values: Iterable[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (ddof=1; 0 for a single value)."""
    values = np.asarray(list(values), dtype=np.float64)
    if values.size == 0:
        return NAN, NAN
    if values.size == 1:
        return float(values[0]), 0.0
    return float(values.mean()), float(values.std(ddof=1))


@dataclass
class SummaryRow:
    """One row of summary.csv: a configuration on a dataset (category 'all') or one category."""

    method: str
    dataset: str
    category: str
    K: int
    L: int
    temperature: float
    num_prompts: int
    num_seeds: int
    spread: str  # what the *_std columns are taken over: 'seeds' or 'prompts'
    block_efficiency: float
    block_efficiency_std: float
    speedup: float
    speedup_std: float
    tokens_per_second: float
    tokens_per_second_std: float
    seconds_per_token: float
    seconds_per_token_std: float
    mean_accepted_len: float
    mean_accepted_len_std: float
    acceptance_rate: float
    acceptance_rate_std: float
    alpha: float
    position_acceptance: list[float]
    predicted_block_efficiency: float
    predicted_block_efficiency_alpha: float
    draft_fraction: float
    target_fraction: float
    verify_fraction: float
    other_fraction: float
    prefill_seconds: float  # mean per prompt
    new_tokens: int
    target_calls: int

    @property
    def label(self) -> str:
        return config_label(self.method, self.K, self.L, self.temperature)


# The figures that get a mean and a spread.
SPREAD_FIELDS = ("block_efficiency", "speedup", "tokens_per_second", "seconds_per_token", "mean_accepted_len", "acceptance_rate")


def _figures(metrics: PooledMetrics, baseline: PooledMetrics | None) -> dict[str, float]:
    values = {name: getattr(metrics, name) for name in SPREAD_FIELDS if name != "speedup"}
    values["speedup"] = speedup(metrics, baseline)
    return values


def _category_groups(records: Sequence[PromptRecord]) -> dict[tuple[str, str], list[PromptRecord]]:
    """(dataset, category) -> records; category 'all' always, each category too when a dataset has several."""
    groups: dict[tuple[str, str], list[PromptRecord]] = defaultdict(list)
    categories: dict[str, set[str]] = defaultdict(set)
    for record in records:
        categories[record.dataset].add(record.category)
    for record in records:
        groups[(record.dataset, ALL_CATEGORIES)].append(record)
        if len(categories[record.dataset]) > 1:
            groups[(record.dataset, record.category)].append(record)
    return groups


def summarize(records: Sequence[PromptRecord], method_order: Sequence[str] = ()) -> list[SummaryRow]:
    """Summary rows of every configuration x dataset (and category), baseline 'ar' included.

    Speedups are taken against the 'ar' records of the same dataset / category, temperature and
    seed (NaN when the baseline is missing)."""
    rows: list[SummaryRow] = []
    for (dataset, category), group in _category_groups(records).items():
        by_config: dict[tuple, dict[int, list[PromptRecord]]] = defaultdict(lambda: defaultdict(list))
        for record in group:
            by_config[record.config_key][record.seed].append(record)
        baselines = {
            (temperature, seed): pool(recs)
            for (method, _, _, temperature), seeds in by_config.items() if method == BASELINE
            for seed, recs in seeds.items()
        }
        baseline_prompts = {
            (r.temperature, r.seed, r.prompt_id): pool([r]) for r in group if r.method == BASELINE
        }
        for (method, num_drafts, draft_len, temperature), seeds in by_config.items():
            everything = [r for recs in seeds.values() for r in recs]
            overall = pool(everything)
            if len(seeds) >= 2:  # mean and std of the per-seed pooled values
                spread = "seeds"
                samples = [_figures(pool(recs), baselines.get((temperature, seed))) for seed, recs in seeds.items()]
                central = {name: mean_std(sample[name] for sample in samples)[0] for name in SPREAD_FIELDS}
            else:  # the pooled value, and the std of the per-prompt values
                spread = "prompts"
                (seed, recs), = seeds.items()
                samples = [_figures(pool([r]), baseline_prompts.get((temperature, seed, r.prompt_id))) for r in recs]
                central = _figures(pool(recs), baselines.get((temperature, seed)))
            figures = {}
            for name in SPREAD_FIELDS:
                figures[name] = central[name]
                figures[f"{name}_std"] = mean_std(sample[name] for sample in samples)[1]
            rows.append(SummaryRow(
                method=method, dataset=dataset, category=category, K=num_drafts, L=draft_len,
                temperature=temperature, num_prompts=len({r.prompt_id for r in everything}),
                num_seeds=len(seeds), spread=spread, **figures,
                alpha=overall.alpha, position_acceptance=list(overall.position_acceptance),
                predicted_block_efficiency=overall.predicted_block_efficiency,
                predicted_block_efficiency_alpha=overall.predicted_block_efficiency_alpha,
                **{f"{part}_fraction": overall.breakdown[part] for part in BREAKDOWN_PARTS},
                prefill_seconds=_ratio(overall.prefill_seconds, overall.num_prompts),
                new_tokens=overall.new_tokens, target_calls=overall.target_calls,
            ))
    order = {name: index for index, name in enumerate([BASELINE, *method_order])}
    datasets = list(dict.fromkeys(r.dataset for r in records))
    rows.sort(key=lambda r: (
        datasets.index(r.dataset), r.category != ALL_CATEGORIES, r.category, r.temperature,
        order.get(r.method, len(order)), r.method, r.K, r.L,
    ))
    return rows
