"""``verispec theory speedup``: expected BE and speedup from the closed forms, best L."""

import re

import pytest

from verispec.cli.bench import speedup_table
from verispec.cli.main import main
from verispec.theory.closed_forms import expected_block_efficiency


def test_speedup_table_uses_the_closed_forms():
    table = speedup_table(0.7, 0.05, 16)
    assert [row[0] for row in table] == list(range(1, 17))
    for draft_len, block_efficiency, speedup in table:
        assert block_efficiency == pytest.approx(expected_block_efficiency(0.7, draft_len))
        assert speedup == pytest.approx(block_efficiency / (1 + 0.05 * draft_len))


def test_theory_cli_prints_the_table_and_the_best_length(capsys):
    assert main(["theory", "speedup", "--alpha", "0.7", "-L", "4", "--cost-ratio", "0.05"]) == 0
    text = capsys.readouterr().out
    rows = re.findall(r"^\s*(\d+)\s+([\d.]+)\s+([\d.]+)", text, re.M)
    assert [int(r[0]) for r in rows] == list(range(1, 17))
    best = max(speedup_table(0.7, 0.05), key=lambda row: row[2])
    assert f"best L = {best[0]}:" in text
    assert f"L = 4: expected BE {expected_block_efficiency(0.7, 4):.4f}" in text


def test_theory_cli_rejects_bad_alpha(capsys):
    assert main(["theory", "speedup", "--alpha", "1.5", "-L", "4"]) == 2
    assert "argument --alpha: must lie in [0, 1]" in capsys.readouterr().err
