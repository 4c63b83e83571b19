"""Metric arithmetic (DESIGN.md §5) on hand-made step records."""

import math

import numpy as np
import pytest

from tests.bench.handmade import output, record
from verispec.bench.metrics import PromptRecord, pool, position_acceptance, speedup, summarize


def test_pooled_metrics_of_one_prompt():
    rec = record("sd", [4, 0, 2], seconds=0.9)
    metrics = pool([rec])
    assert rec.K == 1 and rec.L == 4 and rec.new_tokens == 9 and rec.target_calls == 3
    assert metrics.block_efficiency == pytest.approx(3.0)  # 9 tokens / 3 target calls
    assert metrics.mean_accepted_len == pytest.approx(2.0)
    assert metrics.acceptance_rate == pytest.approx(0.5)  # mean tau / L
    assert metrics.position_acceptance == pytest.approx((2 / 3, 1.0, 0.5, 1.0))
    assert metrics.alpha == pytest.approx(6 / 8)  # sum tau / sum min(tau + 1, L)
    # 1 + sum_i P(tau >= i) = 1 + E[tau] for the pooled estimates
    assert metrics.predicted_block_efficiency == pytest.approx(3.0)
    assert metrics.predicted_block_efficiency_alpha == pytest.approx((1 - 0.75**5) / 0.25)
    assert metrics.seconds_per_token == pytest.approx(0.1)
    assert metrics.tokens_per_second == pytest.approx(10.0)
    assert metrics.breakdown == pytest.approx({"draft": 0.3 / 0.9, "target": 0.45 / 0.9, "verify": 0.06 / 0.9, "other": 0.09 / 0.9})


def test_pooled_metrics_are_ratios_of_totals():
    long = record("sd", [4, 4, 4, 4], seconds=1.0)  # 20 tokens, 4 calls
    short = record("sd", [0, 0], seconds=1.0, prompt_id="p1")  # 2 tokens, 2 calls
    metrics = pool([long, short])
    assert metrics.block_efficiency == pytest.approx(22 / 6)
    assert metrics.tokens_per_second == pytest.approx(22 / 2.0)
    assert metrics.mean_accepted_len == pytest.approx(16 / 6)
    assert metrics.position_acceptance == pytest.approx((4 / 6, 1.0, 1.0, 1.0))


def test_truncated_last_round_counts_emitted_tokens():
    out = output("sd", [4, 3], seconds=1.0)
    out.steps[-1].new_tokens = 2
    out.token_ids = out.token_ids[:7]  # max_new_tokens cut the last block
    rec = PromptRecord.from_output(out, "d", "c", "p", 0.0, 0)
    assert pool([rec]).block_efficiency == pytest.approx(7 / 2)
    assert pool([rec]).mean_accepted_len == pytest.approx(3.5)


def test_ar_baseline_and_speedup():
    ar = record("ar", [0] * 9, seconds=1.8)
    sd = record("sd", [4, 0, 2], seconds=0.9)
    ar_metrics = pool([ar])
    assert ar.K == 0 and ar.L == 0 and ar.accepted_lens == []
    assert ar_metrics.block_efficiency == 1.0
    assert math.isnan(ar_metrics.acceptance_rate) and ar_metrics.position_acceptance == ()
    # SR = (ar seconds / ar tokens) / (method seconds / method tokens) = (1.8 / 9) / (0.9 / 9)
    assert speedup(pool([sd]), ar_metrics) == pytest.approx(2.0)
    assert math.isnan(speedup(pool([sd]), None))


def test_position_acceptance_of_unreached_positions_is_nan():
    rates = position_acceptance([0, 0], 3)
    assert rates[0] == 0.0 and all(math.isnan(r) for r in rates[1:])
    rec = record("sd", [0, 0], seconds=1.0)
    assert pool([rec]).predicted_block_efficiency == pytest.approx(1.0)


def test_summary_mean_and_std_over_seeds():
    records = []
    seed_taus = {0: [4, 0, 2], 1: [1, 1, 1], 2: [4, 4, 0]}
    for seed, taus in seed_taus.items():
        records.append(record("ar", [0] * 9, seconds=0.9, seed=seed))
        records.append(record("sd", taus, seconds=0.6, seed=seed))
    rows = {row.method: row for row in summarize(records, ["sd"])}
    sd = rows["sd"]
    per_seed_be = [sum(t + 1 for t in taus) / len(taus) for taus in seed_taus.values()]
    assert sd.num_seeds == 3 and sd.spread == "seeds"
    assert sd.block_efficiency == pytest.approx(np.mean(per_seed_be))
    assert sd.block_efficiency_std == pytest.approx(np.std(per_seed_be, ddof=1))
    per_seed_sr = [(0.9 / 9) / (0.6 / sum(t + 1 for t in taus)) for taus in seed_taus.values()]
    assert sd.speedup == pytest.approx(np.mean(per_seed_sr))
    assert sd.speedup_std == pytest.approx(np.std(per_seed_sr, ddof=1))
    assert rows["ar"].speedup == pytest.approx(1.0) and rows["ar"].speedup_std == pytest.approx(0.0)
    all_taus = [t for taus in seed_taus.values() for t in taus]
    assert sd.mean_accepted_len == pytest.approx(np.mean([np.mean(t) for t in seed_taus.values()]))
    assert sd.alpha == pytest.approx(sum(all_taus) / sum(min(t + 1, 4) for t in all_taus))
    assert sd.draft_fraction + sd.target_fraction + sd.verify_fraction + sd.other_fraction == pytest.approx(1.0)


def test_summary_with_one_seed_spreads_over_prompts_and_splits_categories():
    records = [
        record("ar", [0] * 10, seconds=1.0, prompt_id="a", category="writing"),
        record("ar", [0] * 4, seconds=0.5, prompt_id="b", category="math"),
        record("sd", [4, 4], seconds=0.5, prompt_id="a", category="writing"),
        record("sd", [1, 1], seconds=0.2, prompt_id="b", category="math"),
    ]
    rows = {(row.method, row.category): row for row in summarize(records, ["sd"])}
    assert set(rows) == {(m, c) for m in ("ar", "sd") for c in ("all", "writing", "math")}
    both = rows[("sd", "all")]
    assert both.spread == "prompts" and both.num_prompts == 2
    assert both.block_efficiency == pytest.approx(14 / 4)  # pooled value
    assert both.block_efficiency_std == pytest.approx(np.std([5.0, 2.0], ddof=1))  # per-prompt BE
    assert both.speedup == pytest.approx((1.5 / 14) / (0.7 / 14))
    per_prompt_sr = [(1.0 / 10) / (0.5 / 10), (0.5 / 4) / (0.2 / 4)]
    assert both.speedup_std == pytest.approx(np.std(per_prompt_sr, ddof=1))
    assert rows[("sd", "math")].block_efficiency == pytest.approx(2.0)
    assert rows[("sd", "math")].speedup == pytest.approx(per_prompt_sr[1])


def test_records_round_trip_through_json():
    rec = record("sd", [4, 0, 2], seconds=0.9)
    data = rec.to_json()
    assert data["block_efficiency"] == pytest.approx(3.0)
    assert data["choices"][0]["accept_lengths"] == [5, 1, 3]
    assert PromptRecord.from_json(data) == rec


def test_block_efficiency_interval_by_hand():
    from verispec.bench.anchor import block_efficiency_interval

    # two records: 10 tokens / 5 calls and 6 tokens / 5 calls -> pooled R = 16 / 10 = 1.6;
    # residuals n - R c = 2 and -2; se = sqrt((4 + 4) / (2 * 1)) / 5 = 0.4; 95 % half-width 1.96 * 0.4
    records = [record("sd", [1] * 5, 1.0), record("sd", [1] * 5, 1.0)]
    records[0].new_tokens, records[0].target_calls = 10, 5
    records[1].new_tokens, records[1].target_calls = 6, 5
    ratio, half_width = block_efficiency_interval(records)
    assert ratio == pytest.approx(1.6) and half_width == pytest.approx(1.96 * 0.4)
    assert block_efficiency_interval(records[:1]) == (2.0, pytest.approx(math.nan, nan_ok=True))
    assert math.isnan(block_efficiency_interval([])[0])
