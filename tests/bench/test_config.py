"""Sweep configuration from flags, YAML and TOML files, and its errors."""

import json

import pytest

from verispec.bench.config import make_config
from verispec.bench.datasets import load_dataset
from verispec.cli.main import main
from verispec.errors import ConfigError


def test_yaml_config(tmp_path, two_prompt_jsonl):
    path = tmp_path / "sweep.yaml"
    path.write_text(
        "methods: [sd, bv, spectr]\n"
        f"dataset: [humaneval, {two_prompt_jsonl}]\n"
        "limit: 3\nK: [1, 2]\nL: 4,8\ntemperatures: [0, 0.6]\nmax-new-tokens: 16\nseeds: [0, 1]\nout: results\n"
    )
    config = make_config(path)
    assert config.methods == ["sd", "bv", "spectr"]
    assert config.dataset == ["humaneval", str(two_prompt_jsonl)]
    assert (config.limit, config.K, config.L, config.temperatures) == (3, [1, 2], [4, 8], [0.0, 0.6])
    assert (config.max_new_tokens, config.seeds, config.out) == (16, [0, 1], "results")


def test_toml_config_with_bench_table_and_flag_overrides(tmp_path, two_prompt_jsonl):
    path = tmp_path / "sweep.toml"
    path.write_text(
        "[bench]\n"
        'methods = "sd,ar,gbv-mod"\n'
        f'datasets = ["{two_prompt_jsonl.name}"]\n'  # relative to the config file
        "num_drafts = [1]\ndraft_len = [2, 3]\ntemperature = 0.5\nrecord = true\nrecord_limit = 5\n"
    )
    config = make_config(path, {"L": "6", "seeds": "3,4", "limit": None})
    assert config.methods == ["sd", "gbv-mod"]  # the 'ar' baseline always runs
    assert config.dataset == [str(two_prompt_jsonl)]
    assert config.L == [6] and config.seeds == [3, 4] and config.temperatures == [0.5]
    assert config.record is True and config.record_limit == 5 and config.limit == 10


def test_unknown_method_names_it(tmp_path):
    with pytest.raises(ConfigError, match="unknown method 'fastest'"):
        make_config(None, {"methods": "sd,fastest"})
    path = tmp_path / "bad.yaml"
    path.write_text("methods: [sd, warp-drive]\n")
    with pytest.raises(ConfigError, match="warp-drive"):
        make_config(path)


def test_missing_dataset_file_and_missing_config_file(tmp_path):
    with pytest.raises(ConfigError, match="no_such.jsonl"):
        make_config(None, {"dataset": [str(tmp_path / "no_such.jsonl")]})
    with pytest.raises(ConfigError, match="not found"):
        make_config(tmp_path / "absent.toml")


def test_empty_dataset(tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    config = make_config(None, {"dataset": [str(empty)]})
    with pytest.raises(ConfigError, match="empty"):
        load_dataset(config.dataset[0], config.limit)


def test_unknown_key_bad_values_and_bad_syntax(tmp_path):
    path = tmp_path / "sweep.yaml"
    path.write_text("methods: [sd]\nbatch_size: 8\n")
    with pytest.raises(ConfigError, match="batch_size"):
        make_config(path)
    with pytest.raises(ConfigError, match="L values must be >= 1"):
        make_config(None, {"L": "0,4"})
    with pytest.raises(ConfigError, match="temperatures"):
        make_config(None, {"temperatures": "-1"})
    with pytest.raises(ConfigError, match="K"):
        make_config(None, {"K": "two"})
    broken = tmp_path / "broken.toml"
    broken.write_text("methods = [sd\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        make_config(broken)
    other = tmp_path / "sweep.json"
    other.write_text(json.dumps({"methods": ["sd"]}))
    with pytest.raises(ConfigError, match=".yaml, .yml or .toml"):
        make_config(other)


def test_spec_bench_limit_applies_per_category(two_prompt_jsonl):
    dataset = load_dataset(str(two_prompt_jsonl), limit=1)
    assert dataset.name == "two_prompts"
    assert [p.category for p in dataset.prompts] == ["writing", "math"]
    assert dataset.prompts[0].text == "Write a short poem about the sea."  # first turn only


def test_cli_reports_config_errors(capsys):
    assert main(["bench", "--methods", "sd,nope", "--no-progress"]) == 2
    assert "unknown method 'nope'" in capsys.readouterr().err
