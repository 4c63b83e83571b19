"""``verispec generate`` and ``verispec demo``."""

from __future__ import annotations

import json
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

import torch

from verispec.engine.decoder import SpeculativeDecoder
from verispec.errors import ConfigError

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
DTYPE_CHOICES = ["auto", *DTYPES]


def resolve_dtype(name: str, device: str | torch.device = "cpu") -> torch.dtype:
    """A --dtype value as a torch dtype; "auto" is the fast dtype of the device (models.default.fast_dtype_name)."""
    if name == "auto":
        from verispec.models.default import fast_dtype_name

        name = fast_dtype_name(device=device)
    return DTYPES[name]


def load_pair(target: str | None, draft: str | None, dtype: str, device: str, need_draft: bool = True, backend: str = "auto"):
    """(target model, tokenizer, draft) from CLI flags; draft None means the default draft.

    backend "llamacpp": the target stays a GGUF name or path (the decoder opens it in llama.cpp)
    and only its tokenizer is loaded; a .gguf draft also runs on llama.cpp, any other on torch."""
    from verispec.models.default import load_model
    from verispec.models.llamacpp import is_gguf_source, load_gguf_tokenizer

    if backend == "llamacpp":
        target_model, tokenizer = target or "default", load_gguf_tokenizer(target)
    else:
        target_model, tokenizer = load_model(target, resolve_dtype(dtype, device), device)
    if not need_draft:
        return target_model, tokenizer, None
    import verispec.models.default_draft  # noqa: F401  registers the sub-vocabulary draft architecture

    from verispec.engine.head_drafter import is_head_source

    if draft in ("ngram", "tree"):
        draft_model = draft
    elif is_head_source(draft):  # "head" or a head directory: the decoder loads it in the target's dtype
        draft_model = draft
    elif draft is None:
        # the fastest measured training-free configuration: target-aware token trees,
        # verified by the q-free rule; the decoder picks the draft that suits --method
        draft_model = None
    elif draft == "default":
        # the shipped trained draft when there is one, else the training-free n-gram draft
        shipped = verispec.models.default_draft.load_default_draft(resolve_dtype(dtype, device), device) if target in (None, "default") else None
        draft_model = shipped if shipped is not None else "ngram"
    elif is_gguf_source(draft):  # opened by the decoder, on llama.cpp
        draft_model = draft
    else:
        draft_model, _ = load_model(draft, resolve_dtype(dtype, device), device)
    return target_model, tokenizer, draft_model


def _decoder(args, target_model, tokenizer, draft_model, method=None) -> SpeculativeDecoder:
    return SpeculativeDecoder(
        target_model,
        draft_model,
        tokenizer=tokenizer,
        method=method or args.method,
        num_drafts=args.num_drafts,
        draft_len=args.draft_len,
        tree=getattr(args, "tree", None),
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        draft_temperature=args.draft_temperature,
        max_new_tokens=args.max_new_tokens,
        stop=getattr(args, "stop", ()),
        seed=args.seed,
        device=args.device,
        backend=getattr(args, "backend", "auto"),
        batch_invariant=getattr(args, "batch_invariant", False),
        adjacency=adjacency_flag(args),
    )


def adjacency_flag(args) -> str | None:
    """``--adjacency FILE``: the table the token-tree draft starts from (``AdjacencyTable.save``);
    None (not given, a command without the flag, or "none"): an empty table."""
    adjacency = getattr(args, "adjacency", None)
    return None if adjacency == "none" else adjacency


def _draft_name(decoder) -> str:
    drafter = decoder.drafter
    if drafter is None:  # plain decoding (--method ar)
        return "none"
    return {"TokenTreeDrafter": "tree", "NGramDrafter": "ngram", "HeadDrafter": "head"}.get(type(drafter).__name__, "model")


def decode_and_print(decoder, prompt_ids, stream: bool):
    """Run a decoder (speculative or SPRINTER) and print its text, streamed or at the end."""
    if stream:
        for piece in decoder.stream(prompt_ids):
            print(piece, end="", flush=True)
        print()
        return decoder.last_output
    output = decoder.generate(prompt_ids)
    print(output.text)
    return output


def _policy_note(output) -> str:
    """How many rounds the size policy made plain (root only), when a policy chose the sizes."""
    decided = [step.policy for step in output.steps if step.policy is not None]
    if not decided:
        return ""
    probes = sum(policy.probe for policy in decided)
    return f", {output.root_only_rounds}/{len(decided)} rounds root-only" + (f", {probes} probes" if probes else "")


def prepare_output_file(path: str | None) -> None:
    """Create the parent directory of an output file (e.g. --stats-json) before any generation,
    so that a bad path fails in a second, not after the whole run."""
    if not path:
        return
    parent = Path(path).expanduser().parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise ConfigError(f"cannot create the directory {str(parent)!r} for {path!r}: {error.strerror}") from error
    if Path(path).is_dir():
        raise ConfigError(f"{path!r} is a directory; give a file name, e.g. {str(Path(path) / 'stats.json')!r}")


def set_threads(threads: int | None, workers: int = 1) -> int:
    """Set torch's CPU threads to ``threads``, or to ``core.threads.default_threads`` when None;
    returns the number set."""
    from verispec.core.threads import default_threads

    chosen = threads or default_threads(workers)
    torch.set_num_threads(chosen)
    return chosen


def check_prompt_source(args) -> None:
    """Exactly one of a prompt and --prompts-file, and no flag that a batch cannot honour."""
    if args.prompt is None and args.prompts_file is None:
        raise ConfigError("give a prompt, e.g. verispec generate \"Write a haiku.\", or --prompts-file FILE to decode many")
    if args.prompt is not None and args.prompts_file is not None:
        raise ConfigError("give either a prompt or --prompts-file, not both")
    if args.prompts_file is not None:
        if args.stream:
            raise ConfigError("--stream prints one sequence as it decodes; drop it with --prompts-file (outputs print at the end)")
        if args.method == "sprinter":
            raise ConfigError("method sprinter decodes one prompt at a time; drop --prompts-file or use another method")


def mean_prompt_tokens(args) -> Callable[[], float]:
    """A function giving the mean length in tokens of the prompts this command decodes (generate's
    prompt or --prompts-file, demo's HumanEval prompts), for ``--backend auto``; it tokenizes, so the
    rule calls it only when a prompt's length decides."""

    def count() -> float:
        from verispec.models.default import encode_prompt
        from verispec.models.llamacpp import load_gguf_tokenizer

        if args.command == "demo":
            from verispec.bench.datasets import humaneval_prompts

            texts = [prompt.text for prompt in humaneval_prompts(args.prompts)]
        else:
            check_prompt_source(args)
            texts = [args.prompt] if args.prompts_file is None else read_prompts_file(args.prompts_file)
        tokenizer = load_gguf_tokenizer(args.target)
        chat = not getattr(args, "no_chat", False)
        return statistics.mean(len(encode_prompt(tokenizer, text, chat=chat)) for text in texts)

    return count


def read_prompts_file(path: str) -> list[str]:
    """The prompts of ``--prompts-file``: a .jsonl file holds one JSON object per line with
    "prompt" (a string) or "turns" (a list of strings, the first is used: Spec-Bench's format);
    any other file one prompt per line. Blank lines are errors (an empty prompt cannot be
    decoded), naming the line."""
    file = Path(path).expanduser()
    try:
        text = file.read_text(encoding="utf-8-sig")
    except IsADirectoryError:
        raise ConfigError(f"--prompts-file {path!r} is a directory; give a file with one prompt per line") from None
    except FileNotFoundError:
        raise ConfigError(f"--prompts-file {path!r} does not exist; give a file with one prompt per line (or a .jsonl file)") from None
    except UnicodeDecodeError:
        raise ConfigError(f"--prompts-file {path!r} is not UTF-8 text") from None
    except OSError as error:
        raise ConfigError(f"cannot read --prompts-file {path!r}: {error.strerror}") from None
    jsonl = file.suffix.lower() == ".jsonl"
    prompts = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            raise ConfigError(f"line {number} of {path!r} is blank: every line must hold a prompt (remove the line)")
        prompts.append(_jsonl_prompt(line, number, path) if jsonl else line)
    if not prompts:
        raise ConfigError(f"--prompts-file {path!r} holds no prompt; write one prompt per line")
    return prompts


def _jsonl_prompt(line: str, number: int, path: str) -> str:
    where = f"line {number} of {path!r}"
    try:
        record = json.loads(line)
    except json.JSONDecodeError as error:
        raise ConfigError(f"{where} is not valid JSON ({error.msg}); write one object per line, e.g. {{\"prompt\": \"...\"}}") from None
    if isinstance(record, dict) and isinstance(record.get("prompt"), str):
        return record["prompt"]
    turns = record.get("turns") if isinstance(record, dict) else None
    if isinstance(turns, list) and turns and isinstance(turns[0], str):
        return turns[0]
    raise ConfigError(f"{where} has neither a \"prompt\" string nor a non-empty \"turns\" list of strings")


def run_generate_batch(args) -> int:
    """--prompts-file: every prompt decoded together (generate_batch), outputs in file order."""
    from verispec.models.default import encode_prompt

    texts = read_prompts_file(args.prompts_file)
    prepare_output_file(args.stats_json)
    set_threads(args.threads)
    target_model, tokenizer, draft_model = load_pair(args.target, args.draft, args.dtype, args.device, args.method != "ar", args.backend)
    decoder = _decoder(args, target_model, tokenizer, draft_model)
    prompts = [encode_prompt(tokenizer, text, chat=not args.no_chat) for text in texts]
    outputs = decoder.generate_batch(prompts, max_batch=args.max_batch)
    failed = 0
    for number, output in enumerate(outputs, start=1):
        print(f"=== prompt {number} ===")
        if output.error is not None:
            failed += 1
            print(f"error: prompt {number}: {output.error}", file=sys.stderr)
            continue
        print(output.text)
        print(f"[prompt {number}: {output.method} draft={_draft_name(decoder)}] {output.new_tokens} tokens, "
              f"{output.target_calls} target calls, block efficiency {output.block_efficiency:.2f}, "
              f"stop {output.stop_reason}" + _policy_note(output), file=sys.stderr)
    seconds = max((o.seconds for o in outputs), default=0.0)
    tokens = sum(o.new_tokens for o in outputs)
    print(f"[batch: {len(outputs)} prompts, at most {args.max_batch} at once] {tokens} tokens in {seconds:.2f} s, "
          f"{tokens / seconds if seconds > 0 else 0.0:.1f} tokens/s in total" + _backend_note(args, decoder), file=sys.stderr)
    if args.stats_json:
        with open(args.stats_json, "w") as handle:
            json.dump({"prompts": len(outputs), "max_batch": args.max_batch, "seconds": seconds,
                       "outputs": [o.to_dict() for o in outputs]}, handle, indent=1)
    return 1 if failed else 0


def _backend_name(decoder) -> str:
    return getattr(decoder.target, "backend", type(decoder.target).__name__)


def _backend_note(args, decoder) -> str:
    """Where the target ran, and why when ``--backend auto`` chose it: the backend decides the
    numerics, so a seed's text on one backend can differ from another's (pin it with --backend)."""
    reason = getattr(args, "backend_reason", None)
    return f"; backend {_backend_name(decoder)}" + (f" (auto: {reason})" if reason else "")


def run_generate(args) -> int:
    from verispec.models.default import encode_prompt

    check_prompt_source(args)
    if args.prompts_file is not None:
        return run_generate_batch(args)
    prepare_output_file(args.stats_json)
    set_threads(args.threads)
    target_model, tokenizer, draft_model = load_pair(args.target, args.draft, args.dtype, args.device, args.method != "ar", args.backend)
    decoder = _decoder(args, target_model, tokenizer, draft_model)
    prompt_ids = encode_prompt(tokenizer, args.prompt, chat=not args.no_chat)
    output = decode_and_print(decoder, prompt_ids, args.stream)
    print(
        f"[{output.method} draft={_draft_name(decoder)} K={output.num_drafts} L={output.draft_len}] {output.new_tokens} tokens, "
        f"{output.target_calls} target calls, block efficiency {output.block_efficiency:.2f}, "
        f"{output.tokens_per_second:.1f} tokens/s" + _policy_note(output) + _backend_note(args, decoder),
        file=sys.stderr,
    )
    if args.stats_json:
        with open(args.stats_json, "w") as handle:
            json.dump(output.to_dict() | {"backend": _backend_name(decoder)}, handle, indent=1)
    return 0


def run_demo(args) -> int:
    """Plain decoding and one speculative method on the same HumanEval prompts, same seeds."""
    from rich.console import Console
    from rich.table import Table

    from verispec.bench.datasets import humaneval_prompts
    from verispec.models.default import encode_prompt
    from verispec.engine.decoder import _as_adapter

    set_threads(args.threads)
    target_model, tokenizer, draft_model = load_pair(args.target, args.draft, args.dtype, args.device, backend=args.backend)
    args.tree, args.stop = None, ()
    target = _as_adapter(target_model, args.device, args.backend)  # one cache for both decoders
    plain = _decoder(args, target, tokenizer, None, method="ar")
    spec = _decoder(args, target, tokenizer, draft_model)
    table = Table(title=f"{spec.method} K={spec.num_drafts} L={spec.draft_len} vs plain decoding, T={args.temperature}, {args.dtype}, draft={_draft_name(spec)}")
    for column in ["prompt", "tokens (plain / spec)", "plain tok/s", "spec tok/s", "block efficiency", "speedup"]:
        table.add_column(column)
    totals = {"plain_tokens": 0, "plain_seconds": 0.0, "spec_tokens": 0, "spec_seconds": 0.0, "calls": 0}
    spec.generate(encode_prompt(tokenizer, "Hello"))  # warm-up: first-call allocations stay out of the numbers
    for prompt in humaneval_prompts(args.prompts):
        ids = encode_prompt(tokenizer, prompt.text)
        base = plain.generate(ids)
        fast = spec.generate(ids)
        totals["plain_tokens"] += base.new_tokens
        totals["plain_seconds"] += base.seconds
        totals["spec_tokens"] += fast.new_tokens
        totals["spec_seconds"] += fast.seconds
        totals["calls"] += fast.target_calls
        table.add_row(
            prompt.prompt_id, f"{base.new_tokens} / {fast.new_tokens}", f"{base.tokens_per_second:.1f}",
            f"{fast.tokens_per_second:.1f}", f"{fast.block_efficiency:.2f}",
            f"{fast.tokens_per_second / base.tokens_per_second:.2f}x",
        )
    plain_rate = totals["plain_tokens"] / totals["plain_seconds"]
    spec_rate = totals["spec_tokens"] / totals["spec_seconds"]
    table.add_row(
        "all", f"{totals['plain_tokens']} / {totals['spec_tokens']}", f"{plain_rate:.1f}", f"{spec_rate:.1f}",
        f"{totals['spec_tokens'] / totals['calls']:.2f}", f"{spec_rate / plain_rate:.2f}x",
    )
    Console(width=160).print(table)
    note = rested_note(totals["spec_tokens"], totals["calls"])
    if note:
        print(note, file=sys.stderr)
    return 0


def rested_note(tokens: int, target_calls: int) -> str | None:
    """A warning for the demo's table when speculation rested on every round (one token per target
    call: the cost model found that trees do not pay here, e.g. on llama.cpp's near-linear
    multi-token forwards): both columns then did the same work and the speedup is timing noise."""
    if target_calls and tokens <= target_calls:
        return ("speculation rested on every round (block efficiency 1.00: each round scored the root alone, "
                "as plain decoding does), so the speedup column measures timing noise, not speculation")
    return None
