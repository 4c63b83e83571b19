"""The writers: records.jsonl, summary.csv, summary.md, the plots and report.html."""

import base64
import json
import math
import re

import pytest

from tests.bench.handmade import sweep_records
from verispec.bench.metrics import summarize
from verispec.bench.report import (
    PLOTS, paper_tables, read_records_jsonl, read_summary_csv, write_reports,
)
from verispec.bench.runner import SkippedConfig

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
REQUIRED_COLUMNS = [
    "method", "dataset", "K", "L", "temperature", "block_efficiency", "speedup", "tokens_per_second",
    "block_efficiency_std", "speedup_std", "tokens_per_second_std", "acceptance_rate", "mean_accepted_len",
    "draft_fraction", "target_fraction", "verify_fraction", "other_fraction", "predicted_block_efficiency",
]


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    out = tmp_path_factory.mktemp("report")
    records = sweep_records()
    rows = summarize(records, ["sd", "bv", "spectr"])
    skipped = [SkippedConfig("sd", 2, 4, "sd verifies a single draft path (chain-only): K > 1 skipped")]
    paths = write_reports(out, records, rows, skipped, {"target": "hand-made", "draft": "none"})
    return out, records, rows, paths


def _same(a, b):
    if isinstance(a, float) and math.isnan(a):
        return isinstance(b, float) and math.isnan(b)
    return a == b


def test_records_jsonl_one_line_per_prompt_and_configuration(written):
    out, records, _, paths = written
    lines = paths["records"].read_text().splitlines()
    assert len(lines) == len(records)
    first = json.loads(lines[0])
    for key in ("question_id", "category", "model_id", "choices", "block_efficiency", "accepted_lens"):
        assert key in first
    back = read_records_jsonl(paths["records"])
    for original, reread in zip(records, back):
        assert all(_same(getattr(original, f), getattr(reread, f)) for f in original.__dataclass_fields__)


def test_summary_csv_rows_and_columns(written):
    _, _, rows, paths = written
    table = read_summary_csv(paths["csv"])
    assert len(table) == len(rows)
    assert all(column in table[0] for column in REQUIRED_COLUMNS)
    # one row per method x dataset (x category) x K x L x temperature
    keys = {(r["method"], r["dataset"], r["category"], r["K"], r["L"], r["temperature"]) for r in table}
    assert len(keys) == len(table)
    sd = next(r for r in table if r["method"] == "sd" and r["category"] == "all" and r["L"] == "4")
    assert float(sd["block_efficiency"]) > 1 and sd["position_acceptance"].count(";") == 3
    assert next(r for r in table if r["method"] == "ar")["acceptance_rate"] == ""  # not applicable


def test_summary_md_paper_layout_with_bold_best(written):
    _, _, rows, paths = written
    text = paths["md"].read_text()
    tables = paper_tables(rows)
    assert len(tables) == 4  # 2 temperatures x 2 draft lengths
    assert tables[0].header == ["dataset", "sd", "bv", "spectr K=2"]
    assert [row[0] for row in tables[0].rows] == ["humaneval", "spec_bench", "spec_bench / math", "spec_bench / writing"]
    for table in tables:
        assert f"### {table.title}" in text
        for row in table.rows:
            assert row[1:].count("–") == 0
            assert sum("**" in cell.split(" / ")[0] for cell in row[1:]) >= 1 or len({c.split(" / ")[0] for c in row[1:]}) == 1
    assert "| dataset | sd | bv | spectr K=2 |" in text
    assert "## Skipped configurations" in text and "chain-only" in text
    assert "predicted BE" in text and "block efficiency: tokens emitted / target forward calls" in text
    for name in PLOTS:
        assert f"({name}.png)" in text


def test_plots_are_pngs(written):
    out, _, _, paths = written
    for name in PLOTS:
        data = paths[name].read_bytes()
        assert data.startswith(PNG_MAGIC) and len(data) > 2000


def test_html_is_self_contained(written):
    _, _, rows, paths = written
    page = paths["html"].read_text()
    assert page.count("<table>") == len(paper_tables(rows)) + 1  # + the full table
    images = re.findall(r'<img alt="[^"]*" src="data:image/png;base64,([A-Za-z0-9+/=]+)">', page)
    assert len(images) == len(PLOTS)
    assert all(base64.b64decode(data).startswith(PNG_MAGIC) for data in images)
    assert "http://" not in page and "https://" not in page  # nothing external to load
    assert "<b>" in page


def test_only_swept_dimensions_get_a_plot_with_their_own_ticks(tmp_path, monkeypatch):
    """One L (4), one temperature, K in {1, 2}: a K plot with ticks exactly 1 and 2, and no L or
    temperature plot (the old report drew an L axis from 3.8 to 4.2 around a single point)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from tests.bench.handmade import record

    records = []
    for prompt in ("p0", "p1"):
        records.append(record("ar", [0] * 8, 1.0, prompt_id=prompt))
        records.append(record("sd", [2, 3, 1], 0.6, prompt_id=prompt))
        records.append(record("spectr", [3, 3, 2], 0.6, prompt_id=prompt, num_drafts=2))
    rows = summarize(records, ["sd", "spectr"])
    figures = []
    original = plt.Figure.savefig

    def keep(figure, *args, **kwargs):
        figures.append(figure)
        return original(figure, *args, **kwargs)

    monkeypatch.setattr(plt.Figure, "savefig", keep)
    paths = write_reports(tmp_path, records, rows, (), {"target": "hand-made", "draft": "none"})
    assert "be_sr_vs_K" in paths and "be_sr_vs_L" not in paths and "be_sr_vs_temperature" not in paths
    assert not (tmp_path / "be_sr_vs_L.png").exists()
    assert "be_sr_vs_L.png" not in paths["md"].read_text()
    vs_k = figures[0]
    for axis in vs_k.axes:
        assert list(axis.get_xticks()) == [1, 2]
        assert [t.get_text() for t in axis.get_xticklabels()] == ["1", "2"]
        assert axis.get_xlabel() == "K (drafted paths)"
    assert "tokens per target call" in vs_k.axes[0].get_ylabel() and "over plain" in vs_k.axes[1].get_ylabel()
    title = vs_k._suptitle.get_text()
    assert "error bars: ± 1 std over" in title and "target hand-made" in title
    breakdown = figures[-1]
    assert "no error bars" in breakdown._suptitle.get_text() and "walltime" in breakdown.axes[0].get_xlabel()
