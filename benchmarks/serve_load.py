"""Bounded load test of ``verispec serve`` on loopback; stops by itself.

    python benchmarks/serve_load.py [--dtype bf16] [--workers 2] [--max-queue 4] [--clients 16]
                                    [--requests 64] [--rounds 3] [--max-tokens 32] [--method sd -L 4]
                                    [--worker-memory 1,2,3]

Starts ``verispec serve`` (default target and draft) as a subprocess on a free loopback port, then
for each round sends ``--requests`` requests from ``--clients`` concurrent clients (chat and
completions, streamed and not, each with a fixed seed). A client that gets a 429 waits the
Retry-After seconds before its next request and does not resend the refused one. Checks:

* every request ends in a complete answer (200, finish_reason, consistent usage) or a 429, none
  lost, none failed;
* none is corrupted: every answer (streamed deltas concatenated) equals the answer the same
  request got alone, before the load;
* the server stays up (/health 200 after every round) and exits cleanly on SIGINT;
* memory does not grow across rounds: server RSS after the last round is within
  ``--rss-tolerance-mb`` of its RSS after the first.

Prints per round: completed / 429 / failed, generated tokens, throughput (tokens/s and
answers/s), latency p50 / p95 of complete answers, server RSS. ``--worker-memory 1,2,3`` also
starts one server per worker count, sends one request, and prints the server RSS, to measure the
memory of each extra worker. Exit status 1 if any check fails.
"""

from __future__ import annotations

import argparse
import json
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import httpx

MODEL = "smollm2-135m-instruct"
PROMPTS = [
    "Write a haiku about the sea.",
    "Explain what a hash table is in two sentences.",
    "List three prime numbers.",
    "What is the boiling point of water?",
    "Give me a short tip for learning Python.",
    "Translate 'good morning' into French.",
    "def fibonacci(n):",
    "Name a famous painting and its painter.",
]


@dataclass
class Outcome:
    kind: str  # complete | refused | failed
    latency: float
    tokens: int = 0
    text: str = ""
    detail: str = ""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def start_server(args, workers: int, port: int) -> subprocess.Popen:
    command = [sys.executable, "-m", "verispec.cli.main", "serve", "--port", str(port), "--dtype", args.dtype,
               "--workers", str(workers), "--max-queue", str(args.max_queue), "--threads-per-worker", "1",
               "--method", args.method, "-K", str(args.num_drafts), "-L", str(args.draft_len), "--shutdown-grace", "5"]
    server = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"the server exited: {server.stderr.read()}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                return server
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    server.kill()
    raise RuntimeError("the server did not become healthy in 300 s")


def stop_server(server: subprocess.Popen) -> int:
    server.send_signal(signal.SIGINT)
    try:
        return server.wait(timeout=60)
    except subprocess.TimeoutExpired:
        server.kill()
        return -9


def request_spec(index: int, max_tokens: int) -> dict:
    """The index-th request: prompt, endpoint, streaming and seed cycle independently."""
    prompt = PROMPTS[index % len(PROMPTS)]
    chat = index % 2 == 0
    seed = (index // len(PROMPTS)) % 2  # 16 distinct requests: prompt x seed (chat or not follows the prompt)
    body = {"model": MODEL, "max_tokens": max_tokens, "seed": seed, "temperature": 0.7}
    if chat:
        body["messages"] = [{"role": "user", "content": prompt}]
    else:
        body["prompt"] = prompt
    return {"path": "/v1/chat/completions" if chat else "/v1/completions", "body": body, "chat": chat,
            "stream": index % 3 == 0, "key": (prompt, chat, seed)}


def send(client: httpx.Client, spec: dict, stream: bool) -> Outcome:
    start = time.perf_counter()
    body = {**spec["body"], "stream": stream}
    try:
        if not stream:
            response = client.post(spec["path"], json=body)
            if response.status_code == 429:
                return Outcome("refused", time.perf_counter() - start, detail=response.headers.get("Retry-After", "1"))
            if response.status_code != 200:
                return Outcome("failed", time.perf_counter() - start, detail=f"{response.status_code} {response.text[:200]}")
            answer = response.json()
            choice = answer["choices"][0]
            text = choice["message"]["content"] if spec["chat"] else choice["text"]
            usage = answer["usage"]
            if choice["finish_reason"] not in ("stop", "length") or usage["total_tokens"] != usage["prompt_tokens"] + usage["completion_tokens"]:
                return Outcome("failed", time.perf_counter() - start, detail=f"incomplete answer {answer}")
            return Outcome("complete", time.perf_counter() - start, usage["completion_tokens"], text)
        pieces, finish, tokens = [], None, 0
        body["stream_options"] = {"include_usage": True}
        with client.stream("POST", spec["path"], json=body) as response:
            if response.status_code == 429:
                return Outcome("refused", time.perf_counter() - start, detail=response.headers.get("Retry-After", "1"))
            if response.status_code != 200:
                return Outcome("failed", time.perf_counter() - start, detail=f"{response.status_code}")
            done = False
            for line in response.iter_lines():
                if not line:
                    continue
                if line == "data: [DONE]":
                    done = True
                    break
                chunk = json.loads(line.removeprefix("data: "))
                if "error" in chunk:
                    return Outcome("failed", time.perf_counter() - start, detail=str(chunk["error"]))
                if chunk.get("usage"):
                    tokens = chunk["usage"]["completion_tokens"]
                for choice in chunk["choices"]:
                    pieces.append((choice["delta"].get("content") if spec["chat"] else choice["text"]) or "")
                    finish = choice["finish_reason"] or finish
        if not done or finish not in ("stop", "length"):
            return Outcome("failed", time.perf_counter() - start, detail="stream ended without [DONE] / finish_reason")
        return Outcome("complete", time.perf_counter() - start, tokens, "".join(pieces))
    except httpx.HTTPError as error:
        return Outcome("failed", time.perf_counter() - start, detail=repr(error))


def run_round(url: str, args, references: dict) -> tuple[list[Outcome], float, list[str]]:
    """One round: ``args.requests`` requests shared by ``args.clients`` client threads."""
    next_index = iter(range(args.requests))
    lock = threading.Lock()
    outcomes: list[Outcome] = []
    problems: list[str] = []

    def client_loop():
        with httpx.Client(base_url=url, timeout=300) as client:
            while True:
                with lock:
                    index = next(next_index, None)
                if index is None:
                    return
                spec = request_spec(index, args.max_tokens)
                outcome = send(client, spec, spec["stream"])
                if outcome.kind == "complete" and outcome.text != references[spec["key"]]:
                    outcome = Outcome("failed", outcome.latency, detail=f"corrupted answer for request {index}: {outcome.text!r} != {references[spec['key']]!r}")
                with lock:
                    outcomes.append(outcome)
                    if outcome.kind == "failed":
                        problems.append(outcome.detail)
                if outcome.kind == "refused":
                    time.sleep(float(outcome.detail))

    start = time.perf_counter()
    with ThreadPoolExecutor(args.clients) as pool:
        for future in [pool.submit(client_loop) for _ in range(args.clients)]:
            future.result()
    return outcomes, time.perf_counter() - start, problems


def percentile(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1] if len(values) > 1 else (values[0] if values else float("nan"))


def measure_worker_memory(args) -> None:
    print("\nserver RSS by worker count (after one request; weights shared, per-worker adapters and caches)")
    print(f"{'workers':>8} {'RSS MB':>8} {'+MB vs previous':>16}")
    previous = None
    for workers in [int(w) for w in args.worker_memory.split(",")]:
        port = free_port()
        server = start_server(args, workers, port)
        try:
            with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=300) as client:
                for index in range(workers):  # touch every worker's caches once
                    send(client, request_spec(index * 2, args.max_tokens), False)
            rss = rss_mb(server.pid)
        finally:
            stop_server(server)
        print(f"{workers:>8} {rss:>8.0f} {'' if previous is None else f'{rss - previous:+.0f}':>16}")
        previous = rss


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dtype", default="bf16", choices=["fp32", "bf16", "fp16"])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--max-queue", type=int, default=4)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--requests", type=int, default=64, help="requests per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--method", default="sd")
    parser.add_argument("-K", "--num-drafts", type=int, default=1)
    parser.add_argument("-L", "--draft-len", type=int, default=4)
    parser.add_argument("--rss-tolerance-mb", type=float, default=30.0)
    parser.add_argument("--worker-memory", default=None, help="e.g. 1,2,3: also measure server RSS per worker count")
    args = parser.parse_args(argv)

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    server = start_server(args, args.workers, port)
    failures: list[str] = []
    try:
        # references: every distinct request alone, before the load (also warms every worker up)
        references = {}
        with httpx.Client(base_url=url, timeout=300) as client:
            for index in range(2 * len(PROMPTS)):
                spec = request_spec(index, args.max_tokens)
                if spec["key"] not in references:
                    outcome = send(client, spec, False)
                    if outcome.kind != "complete":
                        raise RuntimeError(f"reference request failed: {outcome.detail}")
                    references[spec["key"]] = outcome.text
        print(f"verispec serve load: {args.requests} requests x {args.rounds} rounds, {args.clients} clients, "
              f"{args.workers} workers, queue {args.max_queue}, {args.method} K={args.num_drafts} L={args.draft_len}, "
              f"{args.dtype}, max_tokens {args.max_tokens}, default target + default draft, 1 torch thread per worker")
        print(f"{'round':>5} {'complete':>8} {'429':>5} {'failed':>6} {'tokens':>7} {'wall s':>7} {'tok/s':>7} "
              f"{'answers/s':>9} {'p50 s':>6} {'p95 s':>6} {'RSS MB':>7}")
        rss = []
        for round_index in range(1, args.rounds + 1):
            outcomes, wall, problems = run_round(url, args, references)
            failures += problems
            complete = [o for o in outcomes if o.kind == "complete"]
            refused = sum(o.kind == "refused" for o in outcomes)
            if len(outcomes) != args.requests:
                failures.append(f"round {round_index}: {len(outcomes)} outcomes for {args.requests} requests (lost)")
            if httpx.get(url + "/health", timeout=10).status_code != 200:
                failures.append(f"round {round_index}: /health is not 200")
            rss.append(rss_mb(server.pid))
            tokens = sum(o.tokens for o in complete)
            latencies = [o.latency for o in complete]
            print(f"{round_index:>5} {len(complete):>8} {refused:>5} {len(outcomes) - len(complete) - refused:>6} {tokens:>7} "
                  f"{wall:>7.1f} {tokens / wall:>7.1f} {len(complete) / wall:>9.2f} {percentile(latencies, 50):>6.2f} "
                  f"{percentile(latencies, 95):>6.2f} {rss[-1]:>7.0f}")
        if len(rss) > 1 and rss[-1] - rss[0] > args.rss_tolerance_mb:
            failures.append(f"server RSS grew from {rss[0]:.0f} MB after round 1 to {rss[-1]:.0f} MB after round {len(rss)}")
    finally:
        code = stop_server(server)
    if code != 0:
        failures.append(f"the server exited with status {code} on SIGINT")
    if args.worker_memory:
        measure_worker_memory(args)
    for failure in failures[:20]:
        print("FAIL:", failure)
    print("all checks passed" if not failures else f"{len(failures)} checks failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
