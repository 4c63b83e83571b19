"""A tiny end-to-end sweep on the tiny random Llama pair with a two-prompt Spec-Bench file, and
the anchor comparison with transformers' own generate."""

import math

import pytest

from verispec.bench.anchor import HF_ASSISTED, HF_PLAIN, anchor_table
from verispec.bench.config import make_config
from verispec.bench.report import read_summary_csv, write_reports
from verispec.bench.runner import Sweep, run_sweep
from verispec.errors import ConfigError

NEW_TOKENS = 8


def test_tiny_sweep_end_to_end(tiny_pair, two_prompt_jsonl, tmp_path):
    target, draft, tokenizer = tiny_pair
    config = make_config(None, dict(
        methods="sd,bv,spectr,spechub", dataset=[str(two_prompt_jsonl)], K="1,2", L="3", temperatures="0,1",
        max_new_tokens=NEW_TOKENS, seeds="0", out=str(tmp_path), progress=False,
    ))
    result = run_sweep(config, target, tokenizer, draft)
    skipped = {(s.method, s.num_drafts): s.reason for s in result.skipped}
    assert set(skipped) == {("sd", 2), ("bv", 2), ("spechub", 1)}
    assert "chain-only" in skipped[("sd", 2)]
    assert "K = 2" in skipped[("spechub", 1)]  # the engine's own ConfigError, recorded

    configs = {("ar", 0), ("sd", 1), ("bv", 1), ("spectr", 1), ("spectr", 2), ("spechub", 2)}
    assert len(result.records) == 2 * 2 * len(configs)  # prompts x temperatures x configurations
    assert {(r.method, r.K) for r in result.records} == configs
    assert all(r.new_tokens == NEW_TOKENS for r in result.records)  # no EOS in the char tokenizer
    assert all(r.target_calls >= math.ceil(NEW_TOKENS / 4) for r in result.records if r.method != "ar")
    # greedy: every lossless rule reproduces the target's own output
    greedy = {}
    for r in result.records:
        if r.temperature == 0:
            greedy.setdefault(r.prompt_id, set()).add(r.text)
    assert all(len(texts) == 1 for texts in greedy.values())

    paths = write_reports(tmp_path, result.records, result.rows, result.skipped, result.meta)
    for name in ("records.jsonl", "summary.csv", "summary.md", "report.html", "be_sr_vs_K.png", "time_breakdown.png"):
        assert (tmp_path / name).is_file()
    table = read_summary_csv(paths["csv"])
    overall = [r for r in table if r["category"] == "all"]
    assert len(overall) == 2 * len(configs)  # per temperature
    assert {r["category"] for r in table} == {"all", "writing", "math"}
    assert all(float(r["speedup"]) > 0 and float(r["tokens_per_second"]) > 0 for r in table)
    summary = paths["md"].read_text()
    assert "spechub K=1 L=3: spechub drafts hub pairs" in summary


def test_anchor_rows_beside_verispec(tiny_pair, two_prompt_jsonl, tmp_path):
    target, draft, tokenizer = tiny_pair
    config = make_config(None, dict(
        methods="bv", dataset=[str(two_prompt_jsonl)], L="2", temperatures="0,1", max_new_tokens=NEW_TOKENS,
        seeds="0", out=str(tmp_path), anchor=True, progress=False, warmup=False,
    ))
    result = run_sweep(config, target, tokenizer, draft)
    methods = {r.method for r in result.records}
    assert methods == {"ar", "bv", "sd", HF_PLAIN, HF_ASSISTED}  # sd joins for the anchor table
    # greedy decoding: transformers and verispec emit the same tokens
    for prompt_id in ("1", "2"):
        texts = {r.text for r in result.records if r.temperature == 0 and r.prompt_id == prompt_id}
        assert len(texts) == 1
    hf_assisted = [r for r in result.records if r.method == HF_ASSISTED]
    assert all(1 <= r.block_efficiency <= 3 for r in hf_assisted)
    assert all(r.new_tokens == r.target_calls for r in result.records if r.method == HF_PLAIN)
    table = anchor_table(result.rows, result.records)
    assert [(entry["temperature"], entry["L"]) for entry in table] == [(0.0, 2), (1.0, 2)]
    assert all(entry["hf_assisted_be_ci"] >= 0 and entry["verispec_sd_be_ci"] >= 0 for entry in table)
    for entry in table:
        assert entry["sd_over_hf_assisted"] > 0 and entry["hf_generate_tps"] > 0
        assert entry["sd_over_hf_assisted"] == pytest.approx(entry["verispec_sd_tps"] / entry["hf_assisted_tps"])
    paths = write_reports(tmp_path, result.records, result.rows, result.skipped, result.meta)
    assert "Anchor: transformers generate vs verispec" in paths["md"].read_text()


def test_anchor_needs_a_neural_draft(tiny_pair, two_prompt_jsonl):
    target, _, tokenizer = tiny_pair
    config = make_config(None, dict(methods="sd", dataset=[str(two_prompt_jsonl)], anchor=True, progress=False))
    with pytest.raises(ConfigError, match="--draft DIR"):
        Sweep(config, target, tokenizer, "ngram")
