"""``verispec serve`` end to end as a process: flags, /health, a chat answer, clean exit on SIGINT."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import httpx
import pytest

from tests.serve.conftest import tiny_llama
from verispec.cli.main import main


@pytest.mark.parametrize("flag,value,message", [("--workers", "0", "--workers: must be a whole number >= 1"),
                                                ("--max-queue", "0", "--max-queue: must be a whole number >= 1"),
                                                ("--max-batch", "0", "--max-batch: must be a whole number >= 1"),
                                                ("--scheduler", "threads", "--scheduler: invalid choice: 'threads'"),
                                                ("--request-timeout", "0", "--request-timeout: must be a finite number > 0")])
def test_bad_flags_exit_2_naming_the_flag(capsys, flag, value, message):
    assert main(["serve", flag, value]) == 2
    assert message in capsys.readouterr().err


def test_the_default_rule_is_the_engines_for_the_draft():
    from verispec.engine.drafters import default_method

    assert default_method(None) == default_method("tree") == "qfree"
    assert default_method("ngram") == default_method("head") == default_method("/models/draft") == "gumbel"


def test_port_in_use_is_one_line_before_the_model_loads(capsys):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        started = time.monotonic()
        assert main(["serve", "--target", "/nonexistent/model", "--port", str(port)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"cannot listen on 127.0.0.1:{port}" in err and "--port" in err
    assert "serving" not in err and " on http://" not in err  # nothing claims to serve
    assert time.monotonic() - started < 10  # the bind failed before any model was looked for


@pytest.mark.parametrize("scheduler,flags,method,banner", [
    ("workers", ["--draft", "ngram", "--method", "spectr", "-K", "2", "-L", "3", "--scheduler", "workers", "--workers", "2"], "spectr",
     "2 workers x 1 torch threads"),
    ("batch", ["--max-batch", "3"], "qfree", "continuous batch of up to 3 x 1 torch threads"),  # the defaults
])
def test_serve_process(tmp_path, tokenizer, scheduler, flags, method, banner):
    target_dir = tmp_path / "tiny-target"
    tiny_llama(5, len(tokenizer), max_positions=512).save_pretrained(target_dir)
    tokenizer.save_pretrained(target_dir)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(sys.path)}
    command = [sys.executable, "-m", "verispec.cli.main", "serve", "--target", str(target_dir),
               "--host", "127.0.0.1", "--port", str(port), *flags, "--threads-per-worker", "1"]
    server = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            assert server.poll() is None, server.stderr.read()
            try:
                if httpx.get(url + "/health").status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "no /health within 120 s"
            time.sleep(0.2)
        assert httpx.get(url + "/v1/models").json()["data"][0]["id"] == "tiny-target"
        answer = httpx.post(url + "/v1/chat/completions", timeout=60, json={
            "model": "tiny-target", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 6}).json()
        assert answer["speculative"]["method"] == method and answer["usage"]["completion_tokens"] >= 1
        if method == "spectr":
            assert answer["speculative"]["num_drafts"] == 2 and answer["speculative"]["draft_len"] == 3
        assert httpx.get(url + "/health").json()["scheduler"] == scheduler
    finally:
        server.send_signal(signal.SIGINT)
        code = server.wait(timeout=60)
    assert code == 0
    assert banner in server.stderr.read()


@pytest.mark.parametrize("method,num_drafts,tree,error", [
    ("sd", 3, None, None),  # a chain rule under a server K of 3: requests default to K = 1
    ("gumbel", 1, None, None),  # the default with a draft model (as here)
    ("qfree", 1, None, "needs a tree shape"),  # q-free with a draft model: only with a tree
    ("spechub", 2, None, None),
    ("rrsw", 2, (2, 2, 1), None),
    ("nope", 1, None, "unknown speculative.method"),
    ("spechub", 3, (3, 1), "spechub trees have 1 or 2 children"),
])
def test_default_rule_is_checked_at_start(tiny_pair, tokenizer, method, num_drafts, tree, error):
    from verispec.cli.serve import check_default_rule
    from verispec.errors import ConfigError
    from verispec.serve.requests import ServerConfig
    from verispec.serve.launch import build_workers
    from verispec.serve.workers import WorkerPool

    target, draft = tiny_pair
    config = ServerConfig("m", method, num_drafts, len(tree) if tree else 4, tree, 4096, target.config.vocab_size)
    pool = WorkerPool(build_workers(target, draft, tokenizer, 1), max_queue=1)
    if error is None:
        check_default_rule(pool, config)
    else:
        with pytest.raises(ConfigError, match=error):
            check_default_rule(pool, config)
