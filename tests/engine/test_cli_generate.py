"""``verispec generate`` end to end on the embedded default target (issue 3 interface)."""

import json

import pytest

from verispec.cli.main import main

FIELDS = {"method", "new_tokens", "token_ids", "text", "target_calls", "block_efficiency", "tokens_per_second", "seconds"}


@pytest.mark.slow
@pytest.mark.parametrize("method,extra", [("sd", ["-L", "3"]), ("spectr", ["-K", "2", "-L", "3"]), ("ar", [])])
def test_generate_writes_stats_json(tmp_path, capsys, method, extra):
    stats = tmp_path / "stats.json"
    args = ["generate", "Say hello.", "--method", method, *extra, "--temperature", "0", "--max-new-tokens", "6", "--seed", "1", "--stats-json", str(stats)]
    assert main(args) == 0
    record = json.loads(stats.read_text())
    assert FIELDS <= set(record)
    assert record["method"] == method and record["new_tokens"] == len(record["token_ids"]) <= 6
    assert record["text"] in capsys.readouterr().out
    if method == "ar":
        assert record["target_calls"] == record["new_tokens"]


def test_generate_refuses_unknown_method(capsys):
    assert main(["generate", "Hi", "--method", "nope"]) == 2
    assert "unknown method 'nope'" in capsys.readouterr().err


def test_the_demo_says_when_speculation_rested_on_every_round():
    from verispec.cli.generate import rested_note

    assert "timing noise" in rested_note(tokens=64, target_calls=64)
    assert rested_note(tokens=65, target_calls=64) is None  # one round accepted a draft token
    assert rested_note(tokens=0, target_calls=0) is None
