"""``verispec generate --prompts-file`` and ``verispec bench --batch-size`` on a tiny float64 target
(the default tokenizer, so prompts encode as they would for the default model)."""

import json

import pytest

from tests.engine.tiny import tiny_llama
from verispec.cli import bench as bench_cli
from verispec.cli import generate as generate_cli
from verispec.cli.main import main
from verispec.engine.decoder import SpeculativeDecoder


@pytest.fixture(scope="module")
def tiny_default_pair():
    from verispec.models.default import load_default_tokenizer

    tokenizer = load_default_tokenizer()
    return tiny_llama(0, vocab_size=len(tokenizer), max_positions=1024).double(), tokenizer


@pytest.fixture
def tiny_models(monkeypatch, tiny_default_pair):
    model, tokenizer = tiny_default_pair
    monkeypatch.setattr(generate_cli, "load_pair", lambda target, draft, *rest, **options: (model, tokenizer, draft))
    monkeypatch.setattr(bench_cli, "load_models", lambda config: (model, tokenizer, None))
    return model, tokenizer


PROMPTS = ["Write a haiku.", "def add(a, b):", "List three colours."]


def test_prompts_file_decodes_every_line_as_alone(tmp_path, capsys, tiny_models):
    model, tokenizer = tiny_models
    path, stats = tmp_path / "prompts.txt", tmp_path / "stats.json"
    path.write_text("\n".join(PROMPTS) + "\n")
    # --backend native: the tiny target is a torch model, and auto may pick llama.cpp on CPUs without
    # native bf16 when the answer is long for its prompt
    code = main(["generate", "--prompts-file", str(path), "--max-new-tokens", "5", "--temperature", "0",
                 "--max-batch", "2", "--stats-json", str(stats), "--backend", "native"])
    assert code == 0
    captured = capsys.readouterr()
    assert [line for line in captured.out.splitlines() if line.startswith("=== prompt")] == [
        "=== prompt 1 ===", "=== prompt 2 ===", "=== prompt 3 ==="]
    assert "[batch: 3 prompts, at most 2 at once]" in captured.err
    record = json.loads(stats.read_text())
    assert record["prompts"] == 3 and record["max_batch"] == 2
    from verispec.models.default import encode_prompt

    alone = SpeculativeDecoder(model, tokenizer=tokenizer, temperature=0, max_new_tokens=5)
    for text, output in zip(PROMPTS, record["outputs"]):
        assert output["error"] is None and len(output["token_ids"]) == 5
        assert output["token_ids"] == alone.generate(encode_prompt(tokenizer, text)).token_ids
        assert output["text"] in captured.out


def test_jsonl_prompts_file_takes_prompt_or_first_turn(tmp_path, capsys, tiny_models):
    path = tmp_path / "prompts.jsonl"
    path.write_text(json.dumps({"prompt": PROMPTS[0]}) + "\n" + json.dumps({"turns": [PROMPTS[1], "more"]}) + "\n")
    assert generate_cli.read_prompts_file(str(path)) == PROMPTS[:2]
    assert main(["generate", "--prompts-file", str(path), "--max-new-tokens", "3", "--method", "ar",
                 "--backend", "native"]) == 0
    assert capsys.readouterr().out.count("=== prompt") == 2


@pytest.mark.parametrize("content,suffix,message", [
    ("first\n\nthird\n", ".txt", "line 2 of .* is blank"),
    ("", ".txt", "holds no prompt"),
    ('{"prompt": "a"}\n{oops\n', ".jsonl", "line 2 of .* is not valid JSON"),
    ('{"question": "a"}\n', ".jsonl", 'neither a "prompt" string nor a non-empty "turns"'),
    ('{"turns": []}\n', ".jsonl", 'neither a "prompt"'),
])
def test_bad_prompts_files_are_clear_errors(tmp_path, capsys, tiny_models, content, suffix, message):
    path = tmp_path / f"prompts{suffix}"
    path.write_text(content)
    assert main(["generate", "--prompts-file", str(path)]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert __import__("re").search(message, err), err


@pytest.mark.parametrize("argv,message", [
    (["generate", "--prompts-file", "/nonexistent/prompts.txt"], "does not exist"),
    (["generate", "--prompts-file", "/tmp"], "is a directory"),
    (["generate"], "give a prompt"),
    (["generate", "Hi", "--prompts-file", "x.txt"], "not both"),
    (["generate", "--prompts-file", "x.txt", "--stream"], "drop it with --prompts-file"),
    (["bench", "--batch-size", "0,2"], "--batch-size takes whole numbers"),
    (["bench", "--batch-size", "1,2", "--anchor"], "drop --anchor"),
])
def test_bad_batch_flags_are_clear_errors(capsys, argv, message):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_a_bad_prompt_fails_alone(tmp_path, capsys, tiny_models, monkeypatch):
    """A prompt longer than the target's context fails with its message; the others print."""
    path = tmp_path / "prompts.txt"
    path.write_text("\n".join([PROMPTS[0], "word " * 1500, PROMPTS[1]]) + "\n")
    assert main(["generate", "--prompts-file", str(path), "--max-new-tokens", "3", "--method", "ar",
                 "--backend", "native"]) == 1
    captured = capsys.readouterr()
    assert "error: prompt 2:" in captured.err and "does not fit" in captured.err
    assert captured.out.count("=== prompt") == 3


def test_bench_batch_sizes_report_speedup_against_plain_batches(tmp_path, capsys, tiny_models):
    code = main(["bench", "--batch-size", "1,2", "--limit", "2", "--max-new-tokens", "4", "--out", str(tmp_path),
                 "--no-progress"])
    assert code == 0
    out = capsys.readouterr().out
    assert "Speedup by batch size" in out and "speedup vs plain same B" in out
    rows = json.loads((tmp_path / "batch_summary.json").read_text())["rows"]
    assert {(r["batch_size"], r["config"]) for r in rows} == {(b, c) for b in (1, 2) for c in ("ar", "qfree (token trees)")}
    for row in rows:
        assert row["tokens"] == 2 * 4 and row["sequences"] == 2
        assert row["tokens_per_second"] > 0 and row["block_efficiency"] >= 1.0
        if row["config"] == "ar":
            assert row["speedup"] == pytest.approx(1.0) and row["block_efficiency"] == pytest.approx(1.0)
    assert (tmp_path / "batch_summary.md").exists()


def test_bench_batch_with_a_prompt_too_long_is_a_clear_error(tmp_path, capsys, monkeypatch, tiny_default_pair):
    _, tokenizer = tiny_default_pair
    short = tiny_llama(0, vocab_size=len(tokenizer), max_positions=32).double()
    monkeypatch.setattr(bench_cli, "load_models", lambda config: (short, tokenizer, None))
    code = main(["bench", "--batch-size", "2", "--limit", "2", "--max-new-tokens", "4", "--out", str(tmp_path),
                 "--no-progress", "--no-warmup"])
    assert code == 2
    err = capsys.readouterr().err
    assert "cannot be decoded" in err and "does not fit" in err and "Traceback" not in err


def test_the_demo_table_warns_when_the_speculative_column_did_plain_work(capsys, tiny_models):
    """``verispec demo`` on the tiny target with --method ar: both columns decode plainly, so the
    speedup column is noise and the demo says so under its table."""
    assert main(["demo", "--prompts", "1", "--max-new-tokens", "4", "--method", "ar", "--backend", "native"]) == 0
    captured = capsys.readouterr()
    assert "HumanEval/0" in captured.out
    assert "speedup column measures timing noise" in captured.err
