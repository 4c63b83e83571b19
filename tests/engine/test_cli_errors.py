"""Issue 10 item 8, command-line side: clear errors before any work is done, ``python -m verispec``
and a non-zero exit when a benchmark sweep has nothing to measure."""

import subprocess
import sys

import pytest

from tests.engine.tiny import tiny_llama
from verispec.cli import bench as bench_cli
from verispec.cli.generate import prepare_output_file
from verispec.cli.main import main
from verispec.errors import ConfigError


def test_python_dash_m_verispec_runs_the_cli():
    done = subprocess.run([sys.executable, "-m", "verispec", "--help"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "generate" in done.stdout


def test_stats_json_directory_is_created_before_generation(tmp_path):
    target = tmp_path / "new" / "deeper" / "stats.json"
    prepare_output_file(str(target))
    assert target.parent.is_dir()


def test_stats_json_under_a_file_fails_before_loading_any_model(tmp_path, capsys):
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    assert main(["generate", "Hi", "--target", str(tmp_path / "missing"), "--stats-json", str(blocker / "stats.json")]) == 2
    assert "cannot create the directory" in capsys.readouterr().err


def test_stats_json_that_is_a_directory(tmp_path):
    with pytest.raises(ConfigError, match="is a directory"):
        prepare_output_file(str(tmp_path))


def test_empty_target_directory_is_a_clear_error(tmp_path, capsys):
    assert main(["generate", "Hi", "--target", str(tmp_path)]) == 2
    assert "has no config.json" in capsys.readouterr().err


def test_bench_with_every_configuration_skipped_exits_non_zero(tmp_path, capsys, monkeypatch):
    from verispec.models.default import load_default_tokenizer

    tokenizer = load_default_tokenizer()  # converts the default target when the cache is new (clean CI)
    model = tiny_llama(0, vocab_size=len(tokenizer))
    monkeypatch.setattr(bench_cli, "load_models", lambda config: (model, tokenizer, "ngram"))
    code = main(["bench", "--methods", "sd", "-K", "2", "-L", "2", "--limit", "1", "--out", str(tmp_path), "--no-progress"])
    assert code == 2
    err = capsys.readouterr().err
    assert "every configuration of the sweep was skipped" in err and "chain-only" in err
