"""Bounded load test of ``verispec serve`` on loopback; stops by itself.

    python benchmarks/serve_load.py [--dtype bf16] [--scheduler batch|workers] [--workers 2] [--max-batch 8]
                                    [--max-queue 4] [--clients 16] [--requests 64] [--rounds 3] [--max-tokens 32]
                                    [--method sd -L 4] [--worker-memory 1,2,3]
    python benchmarks/serve_load.py --compare 1,2,4,8 [--per-client 3] [--repeats 2] [--max-tokens 32]
                                    [--batch-replicas 2 --batch-threads 1] [--batch-layouts 1x2,2x1]
                                    [--workers-draft ngram --workers-method sd]

``--compare``: both servers (``--workers`` worker threads of 1 torch thread each, and the continuous
batch with ``--batch-threads``, in ``--batch-replicas`` batches side by side; ``--batch-layouts``
starts one batch server per REPLICASxTHREADS item instead) up at once (``--workers-draft ngram``: the
worker server with the n-gram draft and ``sd``, as the server decoded before continuous batching); per client count, rounds of ``clients x --per-client``
streamed requests alternate between them (A B, B A, ...); prints throughput (tokens/s), latency p50 /
p95 and time to first token p50 per scheduler (median [min-max] over ``--repeats``), the 429s and
the answers that differ from the same request alone (all repeats), the ratios to the workers, and the same checks (complete or 429, none lost, every answer equal to the same
request sent alone to that server; half the requests greedy, half seeded at temperature 0.7).
An answer that differs from its answer alone fails the check: a bug, or a float rounding flip of
the target's logits, which depend on the shape of the forward (tree sizes, batch packing, chosen
from timings). bf16 rounds coarsely enough that seeded sampling at temperature 0.7 flips now and
then even with the worker threads; ``--dtype fp32`` tells the two apart.

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
    first_token: float | None = None  # seconds to the first text of a streamed answer


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


def start_server(args, workers: int, port: int, scheduler: str | None = None, layout: tuple[int, int] | None = None) -> subprocess.Popen:
    """``layout``: (replicas, torch threads each) of a batch server (default --batch-replicas x --batch-threads)."""
    scheduler = scheduler or args.scheduler
    replicas, batch_threads = layout or (args.batch_replicas, args.batch_threads)
    threads = batch_threads if scheduler == "batch" else 1
    command = [sys.executable, "-m", "verispec.cli.main", "serve", "--port", str(port), "--dtype", args.dtype,
               "--scheduler", scheduler, "--workers", str(workers), "--max-batch", str(args.max_batch),
               "--max-queue", str(args.max_queue), "--threads-per-worker", str(threads),
               "-K", str(args.num_drafts), "-L", str(args.draft_len), "--shutdown-grace", "5"]
    if args.method:
        command += ["--method", args.method]
    if scheduler == "workers" and args.workers_draft:  # e.g. the server as it was: n-gram draft, sd
        command += ["--draft", args.workers_draft, "--method", args.workers_method or "sd"]
    if scheduler == "batch":
        command += ["--batch-replicas", str(replicas)]
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
    """The index-th request: prompt, endpoint, streaming and seed cycle independently; seed 0 is
    sampled at temperature 0.7, seed 1 greedy (temperature 0)."""
    prompt = PROMPTS[index % len(PROMPTS)]
    chat = index % 2 == 0
    seed = (index // len(PROMPTS)) % 2  # 16 distinct requests: prompt x seed (chat or not follows the prompt)
    body = {"model": MODEL, "max_tokens": max_tokens, "seed": seed, "temperature": 0.7 if seed == 0 else 0.0}
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
        pieces, finish, tokens, first = [], None, 0, None
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
                    if pieces[-1] and first is None:
                        first = time.perf_counter() - start
                    finish = choice["finish_reason"] or finish
        if not done or finish not in ("stop", "length"):
            return Outcome("failed", time.perf_counter() - start, detail="stream ended without [DONE] / finish_reason")
        return Outcome("complete", time.perf_counter() - start, tokens, "".join(pieces), first_token=first)
    except httpx.HTTPError as error:
        return Outcome("failed", time.perf_counter() - start, detail=repr(error))


def run_round(url: str, args, references: dict, clients: int | None = None, requests: int | None = None,
              stream_all: bool = False) -> tuple[list[Outcome], float, list[str]]:
    """One round: ``requests`` requests shared by ``clients`` client threads (default: the flags);
    ``stream_all``: every request streamed (to time the first token)."""
    clients = clients or args.clients
    requests = requests or args.requests
    next_index = iter(range(requests))
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
                outcome = send(client, spec, stream_all or spec["stream"])
                if outcome.kind == "complete" and outcome.text != references[spec["key"]]:
                    outcome = Outcome("failed", outcome.latency, detail=f"request {index} ({'greedy' if spec['body']['temperature'] == 0 else 'seeded'}) "
                                      f"differs from its answer alone: {outcome.text!r} != {references[spec['key']]!r}")
                with lock:
                    outcomes.append(outcome)
                    if outcome.kind == "failed":
                        problems.append(outcome.detail)
                if outcome.kind == "refused":
                    time.sleep(float(outcome.detail))

    start = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        for future in [pool.submit(client_loop) for _ in range(clients)]:
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
        server = start_server(args, workers, port, "workers")
        try:
            with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=300) as client:
                for index in range(workers):  # touch every worker's caches once
                    send(client, request_spec(index * 2, args.max_tokens), False)
            rss = rss_mb(server.pid)
        finally:
            stop_server(server)
        print(f"{workers:>8} {rss:>8.0f} {'' if previous is None else f'{rss - previous:+.0f}':>16}")
        previous = rss


def references_of(url: str, args) -> dict:
    """Every distinct request sent alone (not streamed): the answers the load must reproduce."""
    references = {}
    with httpx.Client(base_url=url, timeout=300) as client:
        for index in range(2 * len(PROMPTS)):
            spec = request_spec(index, args.max_tokens)
            if spec["key"] not in references:
                outcome = send(client, spec, False)
                if outcome.kind != "complete":
                    raise RuntimeError(f"reference request failed: {outcome.detail}")
                references[spec["key"]] = outcome.text
    return references


def parse_layouts(text: str) -> list[tuple[int, int]]:
    """"1x2,2x1" -> [(1, 2), (2, 1)]: (replicas, torch threads each) per batch server."""
    layouts = []
    for item in text.split(","):
        replicas, _, threads = item.strip().partition("x")
        layouts.append((int(replicas), int(threads or 1)))
    return layouts


def compare(args) -> int:
    """The worker threads and the continuous batch side by side: both servers up at once, rounds
    interleaved per client count (A B, then B A, ...), every request streamed; prints one row per
    (clients, scheduler) with the median and spread over the repeats, and the ratios."""
    clients_list = [int(c) for c in args.compare.split(",")]
    layouts = parse_layouts(args.batch_layouts) if args.batch_layouts else [(args.batch_replicas, args.batch_threads)]
    names = ["workers"] + [f"batch {r}x{t}" for r, t in layouts]
    servers, urls, references = {}, {}, {}
    failures: list[str] = []
    try:
        for name in names:
            port = free_port()
            scheduler, layout = ("workers", None) if name == "workers" else ("batch", layouts[names.index(name) - 1])
            servers[name] = start_server(args, args.workers, port, scheduler, layout)
            urls[name] = f"http://127.0.0.1:{port}"
            references[name] = references_of(urls[name], args)
        differ = [key for key in references["workers"] if any(references["workers"][key] != references[name][key] for name in names[1:])]
        workers_rule = f", draft {args.workers_draft} and rule {args.workers_method or 'sd'} L={args.draft_len}" if args.workers_draft else ""
        print(f"verispec serve load, compare: workers ({args.workers} x 1 torch thread{workers_rule}) vs continuous batching as "
              f"replicas x torch threads each {', '.join(names[1:])} (max {args.max_batch} in all), server default rule {args.method or 'qfree (token trees)'}, "
              f"{args.dtype}, max_tokens {args.max_tokens}, {args.per_client} requests per client per round, "
              f"{args.repeats} repeats interleaved, all streamed; half greedy, half seeded at T=0.7")
        print(f"requests whose alone-answer differs between the servers: {len(differ)} of {len(references['workers'])}")
        results: dict = {}
        for clients in clients_list:
            for repeat in range(args.repeats):
                for scheduler in (names if repeat % 2 == 0 else names[::-1]):
                    outcomes, wall, problems = run_round(urls[scheduler], args, references[scheduler], clients,
                                                         clients * args.per_client, stream_all=True)
                    failures += [f"{scheduler}, {clients} clients: {p}" for p in problems]
                    if len(outcomes) != clients * args.per_client:
                        failures.append(f"{scheduler}, {clients} clients: {len(outcomes)} outcomes for "
                                        f"{clients * args.per_client} requests (lost or duplicated)")
                    complete = [o for o in outcomes if o.kind == "complete"]
                    if args.verbose:
                        print(f"  {scheduler} {clients} clients: wall {wall:.2f} s, {sum(o.tokens for o in complete)} tokens, "
                              f"latencies {[round(o.latency, 2) for o in outcomes]}", flush=True)
                    results.setdefault((clients, scheduler), []).append((
                        sum(o.tokens for o in complete) / wall,
                        percentile([o.latency for o in complete], 50),
                        percentile([o.latency for o in complete], 95),
                        percentile([o.first_token for o in complete if o.first_token is not None], 50),
                        sum(o.kind == "refused" for o in outcomes),
                        sum("differs from its answer alone" in o.detail for o in outcomes),
                    ))
        print(f"{'clients':>7} {'scheduler':>11} {'tok/s':>14} {'p50 s':>13} {'p95 s':>13} {'TTFT p50 s':>13} {'429':>4} {'differ':>6} "
              f"{'tok/s vs workers':>17} {'p50 vs workers':>15}")
        for clients in clients_list:
            base = results[(clients, "workers")]
            for scheduler in names:
                rows = results[(clients, scheduler)]

                def cell(column, rows=rows):
                    values = [row[column] for row in rows]
                    return f"{statistics.median(values):.2f} [{min(values):.2f}-{max(values):.2f}]"

                throughput = statistics.median(r[0] for r in rows) / statistics.median(r[0] for r in base)
                latency = statistics.median(r[1] for r in rows) / statistics.median(r[1] for r in base)
                print(f"{clients:>7} {scheduler:>11} {cell(0):>14} {cell(1):>13} {cell(2):>13} {cell(3):>13} "
                      f"{sum(r[4] for r in rows):>4} {sum(r[5] for r in rows):>6} {throughput:>16.2f}x {latency:>14.2f}x")
        for scheduler, url in urls.items():
            if httpx.get(url + "/health", timeout=10).status_code != 200:
                failures.append(f"{scheduler}: /health is not 200 after the load")
    finally:
        for scheduler, server in servers.items():
            if stop_server(server) != 0:
                failures.append(f"the {scheduler} server did not exit cleanly on SIGINT")
    for failure in failures[:20]:
        print("FAIL:", failure)
    print("all checks passed" if not failures else f"{len(failures)} checks failed")
    return 1 if failures else 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dtype", default="bf16", choices=["fp32", "bf16", "fp16"])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--max-queue", type=int, default=4)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--requests", type=int, default=64, help="requests per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--method", default=None, help="the server's --method (default: the server's own, qfree)")
    parser.add_argument("--scheduler", default="batch", choices=["batch", "workers"])
    parser.add_argument("--workers-draft", default=None,
                        help="the worker server's draft instead of the default (ngram: the server before continuous "
                             "batching, with --workers-method, default sd)")
    parser.add_argument("--workers-method", default=None, help="with --workers-draft: the worker server's rule (default sd)")
    parser.add_argument("--max-batch", type=int, default=8)
    parser.add_argument("--batch-threads", type=int, default=2, help="torch threads of the batch (the workers get 1 each)")
    parser.add_argument("--batch-replicas", type=int, default=1, help="continuous batches side by side in the batch server")
    parser.add_argument("--batch-layouts", default=None,
                        help="--compare: several batch servers, REPLICASxTHREADS each, e.g. 1x2,2x1 (default: --batch-replicas x --batch-threads)")
    parser.add_argument("--compare", default=None, help="e.g. 1,2,4,8: workers vs batch at these client counts, interleaved")
    parser.add_argument("--per-client", type=int, default=3, help="--compare: requests per client per round")
    parser.add_argument("--repeats", type=int, default=2, help="--compare: rounds per (clients, scheduler)")
    parser.add_argument("--verbose", action="store_true", help="--compare: print every round's wall time and latencies")
    parser.add_argument("-K", "--num-drafts", type=int, default=1)
    parser.add_argument("-L", "--draft-len", type=int, default=4)
    parser.add_argument("--rss-tolerance-mb", type=float, default=30.0)
    parser.add_argument("--worker-memory", default=None, help="e.g. 1,2,3: also measure server RSS per worker count")
    args = parser.parse_args(argv)
    if args.compare:
        return compare(args)

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    server = start_server(args, args.workers, port)
    failures: list[str] = []
    try:
        # references: every distinct request alone, before the load (also warms every worker up)
        references = references_of(url, args)
        print(f"verispec serve load: {args.requests} requests x {args.rounds} rounds, {args.clients} clients, "
              f"{args.scheduler} scheduler ({args.workers} workers / batch of {args.max_batch}), queue {args.max_queue}, "
              f"{args.method or 'default rule'} K={args.num_drafts} L={args.draft_len}, "
              f"{args.dtype}, max_tokens {args.max_tokens}, default target + default draft, "
              f"{args.batch_threads if args.scheduler == 'batch' else 1} torch thread(s) per worker / batch")
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
