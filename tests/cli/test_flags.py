"""Every bad flag value of the command line: exit status 2, ONE line naming the flag and the fix,
no traceback, before any model is loaded (in-process: the parser and its types)."""

from __future__ import annotations

import pytest
import torch

from verispec.cli.main import main

BAD_FLAGS = [
    (["generate", "hi", "--seed", "-1"], "argument --seed: the seed must be an integer in [0, 2**63)"),
    (["generate", "hi", "--seed", str(2**70)], "got 1180591620717411303424"),
    (["generate", "hi", "--seed", "1.5"], "argument --seed: expected a whole number, got '1.5'"),
    (["generate", "hi", "--seed", "abc"], "expected a whole number"),
    (["generate", "hi", "--temperature", "inf"], "argument --temperature: must be a finite number >= 0 (0 = greedy), got inf"),
    (["generate", "hi", "--temperature", "nan"], "argument --temperature: must be a finite number >= 0"),
    (["generate", "hi", "--temperature", "-0.5"], "argument --temperature: must be a finite number >= 0"),
    (["generate", "hi", "--temperature", "warm"], "argument --temperature: expected a number, got 'warm'"),
    (["generate", "hi", "--draft-temperature", "-1"], "argument --draft-temperature: must be a finite number >= 0"),
    (["generate", "hi", "--top-p", "0"], "argument --top-p: must lie in (0, 1]"),
    (["generate", "hi", "--top-p", "1.5"], "argument --top-p: must lie in (0, 1]"),
    (["generate", "hi", "--top-k", "-1"], "argument --top-k: must be a whole number >= 0"),
    (["generate", "hi", "-K", "0"], "argument -K/--num-drafts: must be a whole number >= 1, got 0"),
    (["generate", "hi", "-L", "-2"], "argument -L/--draft-len: must be a whole number >= 1, got -2 (or 'auto')"),
    (["generate", "hi", "--tree", "2,0,1"], "argument --tree: must be a comma list of whole numbers >= 1"),
    (["generate", "hi", "--tree", "a,b"], "argument --tree: expected a whole number"),
    (["generate", "hi", "--max-new-tokens", "0"], "argument --max-new-tokens: must be a whole number >= 1"),
    (["generate", "hi", "--threads", "0"], "argument --threads: must be a whole number >= 1"),
    (["generate", "hi", "--device", "gpu"], "argument --device: unknown device 'gpu'; use cpu or cuda"),
    (["generate", "hi", "--dtype", "int4"], "argument --dtype: invalid choice: 'int4'"),
    (["generate", "hi", "--method", "nope", "--target", "/nonexistent"], "verispec generate: error:"),
    (["demo", "--seed", "-5"], "argument --seed: the seed must be an integer"),
    (["demo", "--prompts", "0"], "argument --prompts: must be a whole number >= 1"),
    (["serve", "--port", "99999"], "argument --port: must be a TCP port in [0, 65535]"),
    (["serve", "--port", "-1"], "argument --port: must be a TCP port in [0, 65535]"),
    (["serve", "-K", "0"], "argument -K/--num-drafts: must be a whole number >= 1, got 0"),
    (["serve", "-L", "0"], "argument -L/--draft-len: must be a whole number >= 1, got 0"),
    (["serve", "--workers", "0"], "argument --workers: must be a whole number >= 1"),
    (["serve", "--threads-per-worker", "0"], "argument --threads-per-worker: must be a whole number >= 1"),
    (["serve", "--request-timeout", "inf"], "argument --request-timeout: must be a finite number > 0 seconds"),
    (["serve", "--shutdown-grace", "-1"], "argument --shutdown-grace: must be a finite number >= 0 seconds"),
    (["serve", "--max-request-bytes", "10"], "argument --max-request-bytes: must be a whole number >= 1024 bytes"),
    (["serve", "--default-max-tokens", "0"], "argument --default-max-tokens: must be a whole number >= 1"),
    (["bench", "--top-p", "2"], "argument --top-p: must lie in (0, 1]"),
    (["bench", "--threads", "-1"], "argument --threads: must be a whole number >= 1"),
    (["bench", "--replay-seed", "-1"], "argument --replay-seed: the seed must be an integer"),
    (["theory", "speedup", "--alpha", "1.5"], "argument --alpha: must lie in [0, 1]"),
    (["generate"], "give a prompt, e.g. verispec generate"),
    (["nonsense"], "invalid choice: 'nonsense'"),
]
if not torch.backends.cuda.is_built():
    BAD_FLAGS.append((["generate", "hi", "--device", "cuda"], "this torch build has no CUDA; install a CUDA build of torch or use --device cpu"))
    BAD_FLAGS.append((["serve", "--device", "cuda:0"], "this torch build has no CUDA"))


@pytest.mark.parametrize("argv,fragment", BAD_FLAGS, ids=[" ".join(argv) for argv, _ in BAD_FLAGS])
def test_bad_flag_is_one_line_and_exit_2(capsys, argv, fragment):
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.splitlines()
    assert len(lines) == 1, captured.err
    command = argv[0] if argv[0] in ("generate", "demo", "serve", "bench") else None
    assert lines[0].startswith(f"verispec {command}: error: " if command else "verispec")
    assert fragment in lines[0] and "Traceback" not in captured.err


def test_help_still_prints_the_usage(capsys):
    assert main(["generate", "--help"]) == 0
    assert "--seed" in capsys.readouterr().out
