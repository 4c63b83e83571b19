"""``verispec serve``: the OpenAI-compatible server (``verispec.serve``)."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from verispec.cli import flags


def add_serve_parser(sub, add_model_flags, int_list) -> None:
    serve = sub.add_parser("serve", help="OpenAI-compatible HTTP server (/v1/completions, /v1/chat/completions)")
    add_model_flags(serve)
    serve.add_argument("--method", default=None, help="default verification rule of requests (a registry name or 'ar'; "
                       "default as generate: qfree with the token trees, gumbel with a draft model or head)")
    serve.add_argument("-K", "--num-drafts", type=flags.int_at_least(1), default=1, help="default and largest K a request may ask for")
    serve.add_argument("-L", "--draft-len", type=flags.int_at_least(1), default=4, help="default and largest L a request may ask for")
    serve.add_argument("--tree", type=int_list, default=None, help="default tree (children per depth) for tree rules, e.g. 2,2,1")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=flags.port, default=8000, help="TCP port in [0, 65535] (default 8000; 0 = any free port)")
    serve.add_argument("--scheduler", choices=("batch", "workers"), default="batch",
                       help="batch (default): continuous batching, requests join one running batch between rounds; "
                            "workers: --workers threads decoding one request each")
    serve.add_argument("--max-batch", type=flags.int_at_least(1), default=8,
                       help="requests decoded together by the batch scheduler (default 8); more wait in the queue")
    serve.add_argument("--batch-replicas", type=flags.int_at_least(1), default=None,
                       help="continuous batches side by side, each on its own thread over one set of weights; --max-batch and "
                            "--max-queue are shared out between them (default: one per core on a CPU, as long as each keeps 4 "
                            "slots; 1 on a GPU or llama.cpp)")
    serve.add_argument("--workers", type=flags.int_at_least(1), default=1,
                       help="with --scheduler workers: parallel decodes, each with its own KV caches over one shared model")
    serve.add_argument("--max-queue", type=flags.int_at_least(1), default=8, help="requests waiting beyond the running ones; more get 429 + Retry-After")
    serve.add_argument("--threads-per-worker", type=flags.int_at_least(1), default=None,
                       help="torch threads per worker, or per batch replica (default: the cores this process may use divided "
                            "among the workers or the batch replicas, at least 1)")
    serve.add_argument("--request-timeout", type=flags.number_at_least(0, " seconds", strict=True), default=300.0,
                       help="seconds of decoding per request; then the answer so far is returned with finish_reason 'length'")
    serve.add_argument("--default-max-tokens", type=flags.int_at_least(1), default=256, help="max_tokens of chat requests that give none")
    serve.add_argument("--served-model-name", default=None, help="the model id clients pass (default: the target's directory name)")
    serve.add_argument("--shutdown-grace", type=flags.number_at_least(0, " seconds"), default=10.0,
                       help="seconds in-flight requests get to finish on shutdown")
    serve.add_argument("--max-request-bytes", type=flags.int_at_least(1024, " bytes"), default=DEFAULT_MAX_REQUEST_BYTES,
                       help="largest request body; larger ones get 413 before they are read (default 4 MiB = 4194304: "
                            "about 1M prompt tokens, beyond any context served, and small enough that parsing a body "
                            "never stalls the server)")


DEFAULT_MAX_REQUEST_BYTES = 4 * 2**20  # = serve.requests.DEFAULT_MAX_REQUEST_BYTES (not imported: it pulls in torch)


def served_name(target: str | None) -> str:
    from verispec.models.default import DEFAULT_NAME

    return DEFAULT_NAME if target in (None, "default") else Path(target).expanduser().resolve().name


def model_limits(target_model, backend: str) -> tuple[int, int]:
    """(context length, vocabulary size) of the served target: a transformers model's config, or
    on backend "llamacpp" those of a llama.cpp context opened on its GGUF (then closed)."""
    if backend == "llamacpp":
        from verispec.models.llamacpp import load_llamacpp_adapter

        probe = load_llamacpp_adapter(target_model)
        limits = probe.max_context, probe.vocab_size
        probe.close()
        return limits
    out = target_model.get_output_embeddings()
    vocab_size = int(out.weight.shape[0]) if out is not None else int(target_model.config.vocab_size)
    return int(target_model.config.max_position_embeddings), vocab_size


def run_serve(args: argparse.Namespace) -> int:
    import uvicorn

    from verispec.cli.generate import load_pair
    from verispec.engine.drafters import default_method
    from verispec.errors import ConfigError
    from verispec.serve.requests import ServerConfig
    from verispec.serve.launch import build_server

    from verispec.serve.launch import listening_socket

    try:  # before loading the model: a port in use fails in a second, not after the load
        sock = listening_socket(args.host, args.port)
    except OSError as error:
        raise ConfigError(f"cannot listen on {args.host}:{args.port}: {error.strerror or error}; choose another --port "
                          f"(or --host), or stop the process using it") from None
    # the draft is always loaded: a request may choose any rule, whatever the server's default
    target_model, tokenizer, draft = load_pair(args.target, args.draft, args.dtype, args.device, need_draft=True, backend=args.backend)
    if args.device != "cpu" and args.workers > 1 and args.scheduler == "workers":
        print("verispec serve: note: several workers share one device; they do not run in parallel on it", file=sys.stderr)
    max_context, vocab_size = model_limits(target_model, args.backend)
    tree = tuple(args.tree) if args.tree else None
    config = ServerConfig(
        model_name=args.served_model_name or served_name(args.target),
        method=args.method or default_method(args.draft),  # the engine's: qfree over token trees, else gumbel
        # a tree sets the largest shape too: its depth is L, its widest level bounds K
        num_drafts=max(args.num_drafts, max(tree)) if tree else args.num_drafts,
        draft_len=len(tree) if tree else args.draft_len,
        tree=tree,
        max_context=max_context,
        vocab_size=vocab_size,
        default_max_tokens=args.default_max_tokens,
        request_timeout=args.request_timeout,
        shutdown_grace=args.shutdown_grace,
        max_request_bytes=args.max_request_bytes,
    )
    from verispec.serve.replicas import default_replicas

    if args.batch_replicas is None:
        args.batch_replicas = default_replicas(args.max_batch, args.device, args.backend)
    app, pool = build_server(target_model, draft, tokenizer, config, args.workers, args.max_queue, args.threads_per_worker,
                             args.backend, scheduler=args.scheduler, max_batch=args.max_batch, replicas=args.batch_replicas)
    check_default_rule(pool, config)
    host, port = sock.getsockname()[:2]
    if args.scheduler == "batch" and args.batch_replicas > 1:
        shape = (f"{args.batch_replicas} continuous batches of up to {pool.replicas[0].max_batch} x {pool.threads_per_worker} "
                 "torch threads")
    elif args.scheduler == "batch":
        shape = f"continuous batch of up to {args.max_batch} x {pool.threads_per_worker} torch threads"
    else:
        shape = f"{args.workers} workers x {pool.threads_per_worker} torch threads"
    print(f"verispec serve: {config.model_name} on http://{host}:{port} ({shape}, queue {args.max_queue}, default "
          f"{config.method} K={config.num_drafts} L={config.draft_len}, pid {os.getpid()})", file=sys.stderr, flush=True)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=args.shutdown_grace))
    try:
        server.run(sockets=[sock])
    except KeyboardInterrupt:  # uvicorn re-raises the SIGINT it handled once the server has shut down
        pass
    return 0


def check_default_rule(pool, config) -> None:
    """Raise ``ConfigError`` unless a request without a ``speculative`` object can be served: a
    bad --method / -K / -L / --tree fails at start, not on every request."""
    from types import SimpleNamespace

    from verispec.errors import ConfigError
    from verispec.serve.requests import APIError, resolve_speculative
    from verispec.serve.workers import DecodeSettings

    try:
        method, num_drafts, draft_len, tree = resolve_speculative(SimpleNamespace(speculative=None), config)
    except APIError as error:
        raise ConfigError(f"the server's default rule is invalid: {error.message}") from None
    pool.check(DecodeSettings(method, num_drafts, draft_len, tree, 1.0, 0, 1.0, 1, (), 0))
