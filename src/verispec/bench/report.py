"""Writers of a sweep's output folder.

    records.jsonl   one record per prompt x configuration x seed (Spec-Bench-like, metrics.PromptRecord)
    summary.csv     one row per method x dataset (x category) x K x L x temperature (metrics.SummaryRow)
    summary.md      the papers' layout (methods as columns, datasets as rows, "BE / SR" per cell,
                    best of each row in bold), the full table with the theory's predictions,
                    the transformers anchor table and what was skipped
    *.png           BE and SR vs K, vs L, vs temperature; time breakdown bars
    report.html     one self-contained page with the same tables and the plots embedded (base64)
"""

from __future__ import annotations

import base64
import csv
import html
import json
import math
import re
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from verispec.bench.anchor import ANCHOR_COLUMNS, ANCHOR_METHODS, HF_PLAIN, anchor_table
from verispec.bench.metrics import ALL_CATEGORIES, BASELINE, DEFINITIONS, BREAKDOWN_PARTS, PromptRecord, SummaryRow

PLOTS = {
    "be_sr_vs_K": "BE and SR vs K",
    "be_sr_vs_L": "BE and SR vs L",
    "be_sr_vs_temperature": "BE and SR vs temperature",
    "time_breakdown": "Time breakdown of the decoding rounds",
}


@dataclass
class Table:
    """A table rendered both to Markdown and HTML; cells may hold **bold** spans."""

    title: str
    header: list[str]
    rows: list[list[str]]
    note: str = ""


def fmt(value: float, digits: int = 2) -> str:
    return "–" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.{digits}f}"


def fmt_pm(mean: float, std: float, digits: int = 2) -> str:
    if isinstance(mean, float) and math.isnan(mean):
        return "–"
    return fmt(mean, digits) if isinstance(std, float) and math.isnan(std) else f"{fmt(mean, digits)} ± {fmt(std, digits)}"


# ----- files ------------------------------------------------------------------------------
def _json_safe(value):
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    return value


def write_records_jsonl(records: Sequence[PromptRecord], path: Path) -> Path:
    """One JSON object per line; NaN (not measured) is written as null."""
    with path.open("w") as handle:
        for record in records:
            handle.write(json.dumps(_json_safe(record.to_json())) + "\n")
    return path


def read_records_jsonl(path: Path) -> list[PromptRecord]:
    with Path(path).open() as handle:
        return [PromptRecord.from_json(json.loads(line)) for line in handle if line.strip()]


def write_summary_csv(rows: Sequence[SummaryRow], path: Path) -> Path:
    """One row per SummaryRow; position_acceptance as ';'-separated rates; NaN as empty."""
    columns = [f.name for f in fields(SummaryRow)]
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(columns)
        for row in rows:
            values = asdict(row)
            values["position_acceptance"] = ";".join(f"{a:.4f}" for a in row.position_acceptance)
            writer.writerow(["" if isinstance(v, float) and math.isnan(v) else v for v in (values[c] for c in columns)])
    return path


def read_summary_csv(path: Path) -> list[dict]:
    with Path(path).open(newline="") as handle:
        return list(csv.DictReader(handle))


# ----- tables -----------------------------------------------------------------------------
def _is_method_column(row: SummaryRow) -> bool:
    return row.method != BASELINE and row.method not in ANCHOR_METHODS


def _bold_best(values: list[float], texts: list[str]) -> list[str]:
    finite = [v for v in values if not math.isnan(v)]
    best = max(finite) if finite else math.nan
    if len(set(finite)) < 2:  # nothing to single out
        return list(texts)
    return [f"**{t}**" if v == best else t for v, t in zip(values, texts)]


def paper_tables(rows: Sequence[SummaryRow]) -> list[Table]:
    """One table per temperature x L: datasets (and categories) as rows, methods (with K when a
    method runs several) as columns, 'BE / SR' per cell, the best BE and the best SR of each row in bold."""
    tables = []
    method_rows = [r for r in rows if _is_method_column(r)]
    for temperature, draft_len in dict.fromkeys((r.temperature, r.L) for r in method_rows):
        group = [r for r in method_rows if r.temperature == temperature and r.L == draft_len]
        columns = list(dict.fromkeys((r.method, r.K) for r in group))
        ks = defaultdict(set)
        for method, num_drafts in columns:
            ks[method].add(num_drafts)
        labels = [method if len(ks[method]) == 1 and num_drafts == 1 else f"{method} K={num_drafts}" for method, num_drafts in columns]
        index = {(r.dataset, r.category, r.method, r.K): r for r in group}
        body = []
        for dataset, category in dict.fromkeys((r.dataset, r.category) for r in group):
            cells = [index.get((dataset, category, method, num_drafts)) for method, num_drafts in columns]
            be = [c.block_efficiency if c else math.nan for c in cells]
            sr = [c.speedup if c else math.nan for c in cells]
            be_text = _bold_best(be, [fmt_pm(c.block_efficiency, c.block_efficiency_std) if c else "–" for c in cells])
            sr_text = _bold_best(sr, [fmt_pm(c.speedup, c.speedup_std) if c else "–" for c in cells])
            name = dataset if category == ALL_CATEGORIES else f"{dataset} / {category}"
            body.append([name, *[f"{b} / {s}" if c else "–" for b, s, c in zip(be_text, sr_text, cells)]])
        spread = {r.spread for r in group}
        tables.append(Table(
            f"BE / SR at temperature {temperature:g}, L = {draft_len}",
            ["dataset", *labels], body,
            f"Cell: block efficiency / speedup over plain decoding ('ar', same run); ± = std over {' or '.join(sorted(spread))}; best of each row in bold.",
        ))
    return tables


def detail_table(rows: Sequence[SummaryRow]) -> Table:
    """Every summary row with every metric, and the closed forms' predictions beside the measured BE."""
    header = [
        "dataset", "category", "method", "K", "L", "T", "prompts", "seeds", "BE", "predicted BE (a_i)", "BE(alpha)",
        "SR", "tok/s", "ms/token", "accepted len", "acceptance rate", "alpha", "per-position acceptance",
        "draft %", "target %", "verify %", "other %", "prefill ms",
    ]
    body = []
    for r in rows:
        body.append([
            r.dataset, r.category, r.method, str(r.K), str(r.L), f"{r.temperature:g}", str(r.num_prompts), str(r.num_seeds),
            fmt_pm(r.block_efficiency, r.block_efficiency_std), fmt(r.predicted_block_efficiency), fmt(r.predicted_block_efficiency_alpha),
            fmt_pm(r.speedup, r.speedup_std), fmt_pm(r.tokens_per_second, r.tokens_per_second_std, 1),
            fmt_pm(1000 * r.seconds_per_token, 1000 * r.seconds_per_token_std, 1),
            fmt_pm(r.mean_accepted_len, r.mean_accepted_len_std), fmt_pm(r.acceptance_rate, r.acceptance_rate_std),
            fmt(r.alpha), " ".join(fmt(a) for a in r.position_acceptance) or "–",
            *[fmt(100 * getattr(r, f"{part}_fraction"), 1) for part in BREAKDOWN_PARTS],
            fmt(1000 * r.prefill_seconds, 1),
        ])
    return Table("All configurations, measured and predicted", header, body,
                 "predicted BE (a_i) = 1 + Σ_i Π_{j≤i} a_j from the measured per-position acceptance; "
                 "BE(alpha) = (1 − alpha^(L+1)) / (1 − alpha); breakdown = shares of the decoding rounds' time.")


def anchor_view(rows: Sequence[SummaryRow]) -> Table | None:
    table = anchor_table(rows)
    if not table:
        return None
    body = []
    for entry in table:
        body.append([
            entry[key] if key == "dataset" else (f"{entry[key]:g}" if key == "temperature" else str(entry[key]) if key == "L"
                                                 else fmt(entry[key], 1 if key.endswith("tps") else 2))
            for key, _ in ANCHOR_COLUMNS
        ])
    return Table(
        "Anchor: transformers generate vs verispec, same pair, same run",
        [label for _, label in ANCHOR_COLUMNS], body,
        "hf assisted = model.generate(assistant_model=draft) with num_assistant_tokens=L, "
        "num_assistant_tokens_schedule='constant', assistant_confidence_threshold=0 (fixed-length drafts); "
        "its BE counts target forward calls with a forward hook. Last column: verispec sd tokens/s / hf assisted tokens/s.",
    )


def _skipped_lines(skipped) -> list[str]:
    seen = dict.fromkeys(f"{s.method} K={s.num_drafts} L={s.draft_len}: {s.reason}" for s in skipped)
    return list(seen)


def markdown_table(table: Table) -> str:
    lines = [f"### {table.title}", ""]
    lines.append("| " + " | ".join(table.header) + " |")
    lines.append("|" + "|".join("---" for _ in table.header) + "|")
    lines += ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in table.rows]
    if table.note:
        lines += ["", table.note]
    return "\n".join(lines)


def _meta_lines(meta: dict) -> list[str]:
    keys = ["target", "draft", "dtype", "device", "backend", "torch_threads", "transformers", "torch", "machine", "started", "seconds"]
    return [f"{key}: {meta[key]}" for key in keys if key in meta]


def _sections(rows, skipped) -> list[Table]:
    tables = paper_tables(rows)
    anchor = anchor_view(rows)
    if anchor is not None:
        tables.append(anchor)
    tables.append(detail_table(rows))
    return tables


def summary_markdown(rows: Sequence[SummaryRow], skipped=(), meta: dict | None = None, plots: dict | None = None) -> str:
    lines = ["# verispec bench", ""]
    lines += [f"- {line}" for line in _meta_lines(meta or {})]
    lines += ["", "## Definitions", ""]
    lines += [f"- **{name}**: {text}" for name, text in DEFINITIONS]
    lines += ["", "## Results", ""]
    for table in _sections(rows, skipped):
        lines += [markdown_table(table), ""]
    skipped_lines = _skipped_lines(skipped)
    if skipped_lines:
        lines += ["## Skipped configurations", ""]
        lines += [f"- {line}" for line in skipped_lines]
        lines.append("")
    if plots:
        lines += ["## Plots", ""]
        lines += [f"![{PLOTS.get(name, name)}]({path.name})" for name, path in plots.items()]
        lines.append("")
    return "\n".join(lines)


def _html_cell(text: str, tag: str) -> str:
    escaped = html.escape(text)
    return f"<{tag}>" + re.sub(r"\*\*(.+?)\*\*", r"<b>\1</b>", escaped) + f"</{tag}>"


def _html_table(table: Table) -> str:
    parts = [f"<h3>{html.escape(table.title)}</h3>", "<table>", "<thead><tr>"]
    parts += [_html_cell(h, "th") for h in table.header]
    parts.append("</tr></thead><tbody>")
    for row in table.rows:
        parts.append("<tr>" + "".join(_html_cell(cell, "td") for cell in row) + "</tr>")
    parts.append("</tbody></table>")
    if table.note:
        parts.append(f"<p class=note>{html.escape(table.note)}</p>")
    return "\n".join(parts)


HTML_STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em; color: #222; }
table { border-collapse: collapse; margin: 0.5em 0 0.3em; font-size: 13px; }
th, td { border: 1px solid #ccc; padding: 3px 7px; text-align: right; white-space: nowrap; }
th { background: #f0f0f0; } td:first-child, th:first-child { text-align: left; }
.note { color: #666; font-size: 12px; max-width: 70em; }
img { max-width: 100%; border: 1px solid #eee; margin: 0.5em 0; }
.scroll { overflow-x: auto; }
"""


def report_html(rows: Sequence[SummaryRow], skipped=(), meta: dict | None = None, plots: dict | None = None) -> str:
    """A self-contained page: no external resources, plots as data: URIs."""
    parts = [
        "<!DOCTYPE html>", "<html lang=en><head><meta charset=utf-8>",
        "<title>verispec bench report</title>", f"<style>{HTML_STYLE}</style>", "</head><body>",
        "<h1>verispec bench</h1>", "<ul>",
        *[f"<li>{html.escape(line)}</li>" for line in _meta_lines(meta or {})],
        "</ul><h2>Definitions</h2><ul>",
        *[f"<li><b>{html.escape(name)}</b>: {html.escape(text)}</li>" for name, text in DEFINITIONS],
        "</ul><h2>Results</h2>",
    ]
    parts += [f"<div class=scroll>{_html_table(table)}</div>" for table in _sections(rows, skipped)]
    skipped_lines = _skipped_lines(skipped)
    if skipped_lines:
        parts += ["<h2>Skipped configurations</h2><ul>", *[f"<li>{html.escape(line)}</li>" for line in skipped_lines], "</ul>"]
    if plots:
        parts.append("<h2>Plots</h2>")
        for name, path in plots.items():
            data = base64.b64encode(Path(path).read_bytes()).decode("ascii")
            title = html.escape(PLOTS.get(name, name))
            parts.append(f"<figure><img alt=\"{title}\" src=\"data:image/png;base64,{data}\"><figcaption>{title}</figcaption></figure>")
    parts.append("</body></html>")
    return "\n".join(parts)


# ----- plots -------------------------------------------------------------------------------
def _mean_over_datasets(rows: Sequence[SummaryRow], key) -> dict:
    """key(row) -> (mean BE, mean BE std, mean SR, mean SR std) over the datasets' 'all' rows."""
    groups = defaultdict(list)
    for row in rows:
        if row.category == ALL_CATEGORIES:
            groups[key(row)].append(row)
    out = {}
    for group_key, group in groups.items():
        n = len(group)
        out[group_key] = tuple(sum(getattr(r, name) for r in group) / n for name in
                               ("block_efficiency", "block_efficiency_std", "speedup", "speedup_std"))
    return out


def _series_label(method: str, num_drafts: int, many_k: bool) -> str:
    return f"{method} K={num_drafts}" if many_k else method


AXIS_LABELS = {"K": "K (drafted paths)", "L": "L (draft length, tokens)", "temperature": "temperature (target and draft)"}


def swept_axis(axis, values: Sequence[float], integer: bool) -> None:
    """Ticks exactly at the swept values (integers for K and L: no 1.5 drafts, no 3.8..4.2 axis)."""
    values = sorted(set(values))
    axis.set_xticks(values)
    axis.set_xticklabels([str(int(v)) if integer else f"{v:g}" for v in values])


def _spread_words(rows: Sequence[SummaryRow]) -> str:
    spreads = {r.spread for r in rows}
    over = spreads.pop() if len(spreads) == 1 else "seeds or prompts"
    return f"error bars: ± 1 std over {over}, averaged over datasets"


def _plot_vs(rows: Sequence[SummaryRow], dimension: str, path: Path, meta: dict | None = None) -> Path | None:
    """BE and speedup vs one dimension, the others fixed at their first value; None (no file)
    when that dimension was not swept (fewer than 2 values among the chosen rows)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    speculative = [r for r in rows if r.L > 0 and r.method != HF_PLAIN]
    first_l = min((r.L for r in speculative), default=0)
    first_t = min((r.temperature for r in speculative), default=0.0)
    if dimension == "K":
        chosen = [r for r in speculative if r.L == first_l and r.temperature == first_t]
        fixed = f"L = {first_l}, T = {first_t:g}"
    elif dimension == "L":
        chosen = [r for r in speculative if r.temperature == first_t]
        fixed = f"T = {first_t:g}"
    else:
        chosen = [r for r in speculative if r.L == first_l]
        fixed = f"L = {first_l}"
    x_of = {"K": lambda r: r.K, "L": lambda r: r.L, "temperature": lambda r: r.temperature}[dimension]
    swept = sorted({x_of(r) for r in chosen if r.method not in ANCHOR_METHODS})
    if len(swept) < 2:
        return None
    many_k = len({r.K for r in chosen if r.method not in ANCHOR_METHODS}) > 1
    series_key = (lambda r: (r.method,)) if dimension == "K" else (lambda r: (r.method, r.K))
    points = _mean_over_datasets(chosen, lambda r: (*series_key(r), x_of(r)))
    figure, axes = plt.subplots(1, 2, figsize=(10, 4.2))
    for series in dict.fromkeys(key[:-1] for key in points):
        xs = sorted(key[-1] for key in points if key[:-1] == series)
        values = [points[(*series, x)] for x in xs]
        label = series[0] if len(series) == 1 else _series_label(series[0], series[1], many_k)
        for axis, (mean_index, std_index) in zip(axes, ((0, 1), (2, 3))):
            axis.errorbar(xs, [v[mean_index] for v in values], yerr=[v[std_index] for v in values],
                          marker="o", capsize=3, label=label)
    axes[0].set_ylabel("block efficiency (tokens per target call)")
    axes[1].set_ylabel("speedup (tokens/s over plain decoding's)")
    for axis in axes:
        axis.set_xlabel(AXIS_LABELS[dimension])
        swept_axis(axis, swept, integer=dimension in ("K", "L"))
        axis.grid(alpha=0.3)
    axes[1].legend(fontsize=8)
    datasets = ", ".join(sorted({r.dataset for r in chosen}))
    pair = f"target {meta.get('target')}, draft {meta.get('draft')}; " if meta and meta.get("target") else ""
    figure.suptitle(f"Block efficiency and speedup vs {dimension} ({fixed}; {pair}{datasets})\n{_spread_words(chosen)}",
                    fontsize=10)
    figure.tight_layout()
    figure.savefig(path, dpi=90)
    plt.close(figure)
    return path


def _plot_breakdown(rows: Sequence[SummaryRow], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = defaultdict(list)
    for row in rows:
        if row.category == ALL_CATEGORIES and not math.isnan(row.target_fraction):
            groups[row.label].append(row)
    labels = list(groups)
    figure, axis = plt.subplots(figsize=(9, 0.45 * max(len(labels), 2) + 1.4))
    left = [0.0] * len(labels)
    for part in BREAKDOWN_PARTS:
        widths = [sum(getattr(r, f"{part}_fraction") for r in groups[label]) / len(groups[label]) for label in labels]
        axis.barh(labels, widths, left=left, label=part)
        left = [a + b for a, b in zip(left, widths)]
    axis.set_xlim(0, 1)
    axis.set_xlabel("fraction of the decoding rounds' walltime (prefill excluded)")
    axis.invert_yaxis()
    axis.legend(ncol=4, fontsize=8, loc="lower center", bbox_to_anchor=(0.5, 1.0), frameon=False)
    figure.suptitle("Time breakdown of the decoding rounds: draft / target / verify / other\n"
                    "(mean over datasets, seeds and prompts; no error bars)", fontsize=10)
    figure.tight_layout()
    figure.savefig(path, dpi=90)
    plt.close(figure)
    return path


def make_plots(rows: Sequence[SummaryRow], out_dir: Path, meta: dict | None = None) -> dict[str, Path]:
    """The PNG plots (``PLOTS``) under out_dir: a "vs" plot only for a dimension that was swept."""
    plots = {}
    for name in PLOTS:
        if name.startswith("be_sr_vs"):
            drawn = _plot_vs(rows, name.rsplit("_", 1)[1], out_dir / f"{name}.png", meta)
            if drawn is not None:
                plots[name] = drawn
    plots["time_breakdown"] = _plot_breakdown(rows, out_dir / "time_breakdown.png")
    return plots


def write_reports(out_dir, records: Sequence[PromptRecord], rows: Sequence[SummaryRow], skipped=(), meta: dict | None = None) -> dict[str, Path]:
    """Write records.jsonl, summary.csv, the plots, summary.md and report.html into out_dir."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {
        "records": write_records_jsonl(records, out_dir / "records.jsonl"),
        "csv": write_summary_csv(rows, out_dir / "summary.csv"),
    }
    plots = make_plots(rows, out_dir, meta)
    paths.update(plots)
    paths["md"] = out_dir / "summary.md"
    paths["md"].write_text(summary_markdown(rows, skipped, meta, plots))
    paths["html"] = out_dir / "report.html"
    paths["html"].write_text(report_html(rows, skipped, meta, plots))
    if meta is not None:
        paths["meta"] = out_dir / "run.json"
        paths["meta"].write_text(json.dumps(_json_safe({**meta, "skipped": [asdict(s) for s in skipped]}), indent=1, default=str))
    return paths
