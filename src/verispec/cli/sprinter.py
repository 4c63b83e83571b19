"""``verispec sprinter collect | train | eval`` and ``verispec generate --method sprinter``
(ALGORITHMS.md §11). SPRINTER is LOSSY: it trades exactness for fewer target calls.

    verispec sprinter collect --spec-bench question.jsonl --categories qa,writing --id-parity odd \\
        --humaneval 100:164 --temperature 0.6 --out runs/sprinter/data-train
    verispec sprinter train --data runs/sprinter/data-train --test-data runs/sprinter/data-test \\
        --gamma 1.2 --eta 0.5 --out runs/sprinter/verifier
    verispec sprinter eval --verifier runs/sprinter/verifier/<target>__ngram__g1.2.pt \\
        --spec-bench question.jsonl --categories summarization --id-parity even --limit 5 \\
        --max-new-tokens 64 --out runs/sprinter/eval
    verispec generate "..." --method sprinter --verifier PATH
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from verispec.errors import ConfigError

DTYPE_NAMES = ("fp32", "bf16", "fp16")


# ----- argument parsing ----------------------------------------------------------------------------
def _pair_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--target", default=None, help="target model directory, or gemma3-270m (optional extra) (default: embedded SmolLM2-135M-Instruct)")
    parser.add_argument("--draft", default="ngram", help="'ngram' (default, the training-free draft) or a draft model directory")
    parser.add_argument("--dtype", default="fp32", choices=DTYPE_NAMES)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")


def _sampling_flags(parser: argparse.ArgumentParser, default_temperature: float | None = 1.0) -> None:
    parser.add_argument("--temperature", type=float, default=default_temperature, help="sampling temperature for both models")
    parser.add_argument("--top-k", type=int, default=0)
    parser.add_argument("--top-p", type=float, default=1.0)


def _prompt_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--spec-bench", default=None, help="Spec-Bench-format JSONL prompt file (question_id, category, turns)")
    parser.add_argument("--categories", default=None, help="comma-separated Spec-Bench categories (default: all)")
    parser.add_argument("--id-parity", default="all", choices=["all", "odd", "even"], help="keep question_ids of this parity (train/eval split)")
    parser.add_argument("--limit", type=int, default=None, help="at most this many Spec-Bench prompts per category")
    parser.add_argument("--humaneval", default=None, help="HumanEval task index range START:END, e.g. 100:164")
    parser.add_argument("--max-prompt-tokens", type=int, default=None, help="skip prompts longer than this (bounds prefill cost)")
    parser.add_argument("--no-chat", action="store_true", help="do not wrap prompts in the chat template")


def add_sprinter_parser(sub) -> argparse.ArgumentParser:
    """Register ``verispec sprinter`` with its collect / train / eval subcommands."""
    parser = sub.add_parser("sprinter", help="SPRINTER (lossy): collect verifier data, train the verifier, evaluate vs SD")
    actions = parser.add_subparsers(dest="sprinter_command", required=True)

    collect = actions.add_parser("collect", help="sample prefixes of the four kinds and label drafted tokens")
    _pair_flags(collect)
    _prompt_flags(collect)
    _sampling_flags(collect)
    collect.add_argument("--samples-per-kind", type=int, default=12, help="samples per prompt and prefix kind (default 12)")
    collect.add_argument("--continuation-len", type=int, default=24, help="length of the draft/target/mixed continuations (default 24)")
    collect.add_argument("--seed", type=int, default=0)
    collect.add_argument("--out", required=True, help="output directory (data.pt + collect.json)")

    train = actions.add_parser("train", help="train the verifier (linear or one hidden layer, BCE, Adam, early stopping)")
    train.add_argument("--data", action="append", required=True, help="data.pt file or collect directory (repeatable)")
    train.add_argument("--test-data", action="append", default=[], help="held-out prompts' data for the reported AUC (repeatable)")
    train.add_argument("--gamma", type=float, default=1.2, help="label: acceptable iff q(x)/p(x) <= gamma (1, 1.2, 1.5)")
    train.add_argument("--eta", type=float, default=0.5, help="inference threshold in (0, 1): accept iff score >= eta")
    train.add_argument("--hidden", type=int, default=0, help="hidden units (0 = linear + sigmoid, the paper's verifier)")
    train.add_argument("--epochs", type=int, default=60)
    train.add_argument("--patience", type=int, default=6)
    train.add_argument("--lr", type=float, default=5e-3)
    train.add_argument("--batch-size", type=int, default=512)
    train.add_argument("--val-fraction", type=float, default=0.2, help="share of training prompts held out for early stopping")
    train.add_argument("--max-minutes", type=float, default=20.0)
    train.add_argument("--seed", type=int, default=0)
    train.add_argument("--threads", type=int, default=None)
    train.add_argument("--out", default=None, help="directory for the verifier file, train.json and roc.png (default: ~/.cache/verispec/sprinter)")

    evaluate = actions.add_parser("eval", help="SPRINTER vs SD on the same prompts: speedup, tokens/target call, ROUGE, TV")
    _pair_flags(evaluate)
    _prompt_flags(evaluate)
    _sampling_flags(evaluate, default_temperature=None)
    evaluate.add_argument("--verifier", required=True, help="verifier file from `verispec sprinter train`")
    evaluate.add_argument("--eta", type=float, default=None, help="override the file's threshold (in (0, 1))")
    evaluate.add_argument("--max-run", type=int, default=32, help="target call after this many verifier-accepted tokens in a row")
    evaluate.add_argument("--sd-draft-len", type=int, default=4, help="SD baseline: L (K = 1, same draft)")
    evaluate.add_argument("--max-new-tokens", type=int, default=64)
    evaluate.add_argument("--seeds", default="0", help="comma-separated seeds per prompt")
    evaluate.add_argument("--no-ar", action="store_true", help="skip the plain-sampling baseline")
    evaluate.add_argument("--tv-positions", type=int, default=16, help="contexts per prompt for the exact TV estimate (0 skips it)")
    evaluate.add_argument("--no-toy-check", action="store_true", help="skip the exact toy-model check of Thms 3.1 / 3.3")
    evaluate.add_argument("--out", required=True, help="output directory (eval.json)")
    return parser


# ----- helpers -------------------------------------------------------------------------------------
def _set_threads(threads) -> None:
    if threads:
        import torch

        torch.set_num_threads(int(threads))


def _load_pair(args):
    """(target model, tokenizer, draft: 'ngram' or model)."""
    from verispec.cli.generate import resolve_dtype
    from verispec.models.default import load_model

    dtype = resolve_dtype(args.dtype)  # "auto" from `verispec generate --method sprinter`
    target, tokenizer = load_model(args.target, dtype, args.device)
    draft = args.draft
    if draft in (None, "default", "ngram"):
        draft = "ngram"
    else:
        draft, _ = load_model(draft, dtype, args.device)
    return target, tokenizer, draft


def _range(text: str) -> tuple[int, int]:
    try:
        start, end = (int(part) for part in text.split(":"))
    except ValueError as error:
        raise ConfigError(f"expected a range START:END, got {text!r}") from error
    return start, end


def select_prompts(args, tokenizer) -> list:
    """Prompts from the Spec-Bench file and/or HumanEval, filtered as the flags say; returns
    ``evaluate.EvalPrompt`` records (id, token ids, reference)."""
    from verispec.bench.datasets import humaneval_prompts, spec_bench_prompts
    from verispec.models.default import encode_prompt
    from verispec.sprinter.evaluate import EvalPrompt

    chosen = []
    if args.spec_bench:
        categories = args.categories.split(",") if args.categories else None
        records = spec_bench_prompts(args.spec_bench, categories=categories)
        parity = {"odd": 1, "even": 0}.get(args.id_parity)
        per_category: dict[str, int] = {}
        for record in records:
            if parity is not None and int(record.prompt_id) % 2 != parity:
                continue
            if args.limit is not None and per_category.get(record.category, 0) >= args.limit:
                continue
            ids = encode_prompt(tokenizer, record.text, chat=not args.no_chat)
            if args.max_prompt_tokens and len(ids) > args.max_prompt_tokens:
                continue
            per_category[record.category] = per_category.get(record.category, 0) + 1
            chosen.append(EvalPrompt(f"spec-bench/{record.prompt_id}", ids, record.reference))
    if args.humaneval:
        start, end = _range(args.humaneval)
        for record in humaneval_prompts(limit=end - start, offset=start):
            ids = encode_prompt(tokenizer, record.text, chat=not args.no_chat)
            if args.max_prompt_tokens and len(ids) > args.max_prompt_tokens:
                continue
            chosen.append(EvalPrompt(record.prompt_id, ids, None))
    if not chosen:
        raise ConfigError("no prompts selected: give --spec-bench FILE (with --categories / --id-parity) and/or --humaneval START:END")
    return chosen


def _data_path(path: str) -> Path:
    path = Path(path).expanduser()
    return path / "data.pt" if path.is_dir() else path


def _merge(datasets: list[dict]) -> dict:
    """Concatenate collected datasets (same feature spec); prompt indices are made distinct."""
    import torch

    first = datasets[0]["meta"]
    for data in datasets[1:]:
        for key in ("feature_set", "dim", "target", "draft", "hidden_size"):
            if data["meta"].get(key) != first.get(key):
                raise ConfigError(f"data files disagree on {key}: {first.get(key)!r} vs {data['meta'].get(key)!r}; collect them for one pair")
    merged = {key: torch.cat([d[key] for d in datasets]) for key in ("features", "token", "draft_prob", "target_prob", "kind", "position")}
    offset, indices, names = 0, [], []
    for data in datasets:
        indices.append(data["prompt_index"] + offset)
        names += data["prompt_ids"]
        offset += len(data["prompt_ids"])
    merged["prompt_index"] = torch.cat(indices)
    merged["prompt_ids"] = names
    merged["meta"] = first
    return merged


# ----- commands ------------------------------------------------------------------------------------
def run_collect(args) -> int:
    from verispec.core.sampling import SamplingParams
    from verispec.engine.decoder import _as_adapter
    from verispec.sprinter.collect import CollectConfig, Collector, label_summary, make_oracle, save_dataset
    from verispec.sprinter.features import make_extractor
    from verispec.sprinter.train import write_json

    _set_threads(args.threads)
    target, tokenizer, draft = _load_pair(args)
    prompts = select_prompts(args, tokenizer)
    config = CollectConfig(args.samples_per_kind, args.continuation_len, args.temperature, args.top_k, args.top_p, args.seed)
    adapter = _as_adapter(target)
    oracle = make_oracle(draft, adapter.vocab_size, SamplingParams(args.temperature, args.top_k, args.top_p))
    extractor = make_extractor(target, draft)
    collector = Collector(adapter, oracle, extractor, config)
    dataset = collector.collect([(p.prompt_id, p.ids) for p in prompts], log=lambda m: print(m, file=sys.stderr))
    out = Path(args.out)
    save_dataset(dataset, out / "data.pt")
    summary = {
        "samples": int(len(dataset["token"])),
        "prompts": dataset["prompt_ids"],
        "acceptable_fraction": label_summary(dataset),
        **{k: v for k, v in dataset["meta"].items()},
        "command": " ".join(sys.argv),
    }
    write_json(out / "collect.json", summary)
    print(json.dumps({k: summary[k] for k in ("samples", "acceptable_fraction", "seconds")}, indent=1))
    return 0


def run_train(args) -> int:
    import torch

    from verispec.sprinter.collect import load_dataset
    from verispec.sprinter.train import (
        TrainConfig, default_verifier_path, labels_for_gamma, plot_roc, rates_at, roc_auc, roc_curve, save_verifier,
        split_by_prompt, train_verifier, write_json,
    )
    from verispec.verify.sprinter import check_threshold

    check_threshold(args.eta)
    _set_threads(args.threads)
    data = _merge([load_dataset(_data_path(p)) for p in args.data])
    meta = data["meta"]
    features = data["features"].float().numpy()
    labels = labels_for_gamma(data["target_prob"].numpy(), data["draft_prob"].numpy(), args.gamma)
    config = TrainConfig(
        gamma=args.gamma, eta=args.eta, hidden_units=args.hidden, learning_rate=args.lr, batch_size=args.batch_size,
        max_epochs=args.epochs, patience=args.patience, val_fraction=args.val_fraction, seed=args.seed, max_seconds=args.max_minutes * 60,
    )
    net, report = train_verifier(features, labels, data["prompt_index"].numpy(), config, log=lambda m: print(m, file=sys.stderr))

    curves, points = {}, {}
    _, val_mask = split_by_prompt(data["prompt_index"].numpy(), config.val_fraction, config.seed)  # the split training used
    with torch.no_grad():
        val_scores = net(torch.from_numpy(features[val_mask])).numpy()
    fpr, tpr, _ = roc_curve(labels[val_mask], val_scores)
    curves["validation prompts"] = (fpr, tpr, report["val_auc"])
    metrics = {"auc_source": "validation prompts (held out of training)", "auc": report["val_auc"], **report["val_rates"]}
    val_gamma1 = labels_for_gamma(data["target_prob"].numpy()[val_mask], data["draft_prob"].numpy()[val_mask], 1.0)
    metrics["fpr_gamma1"] = rates_at(val_gamma1, val_scores, args.eta)["fpr"]
    points[f"validation at eta={args.eta:g}"] = (metrics["fpr"], metrics["tpr"])
    if args.test_data:
        test = _merge([load_dataset(_data_path(p)) for p in args.test_data])
        if test["meta"].get("dim") != meta.get("dim") or test["meta"].get("feature_set") != meta.get("feature_set"):
            raise ConfigError("test data were collected for another pair / feature set than the training data")
        test_labels = labels_for_gamma(test["target_prob"].numpy(), test["draft_prob"].numpy(), args.gamma)
        with torch.no_grad():
            test_scores = net(test["features"].float()).numpy()
        test_auc = roc_auc(test_labels, test_scores)
        fpr, tpr, _ = roc_curve(test_labels, test_scores)
        curves["held-out test prompts"] = (fpr, tpr, test_auc)
        rates = rates_at(test_labels, test_scores, args.eta)
        points[f"test at eta={args.eta:g}"] = (rates["fpr"], rates["tpr"])
        test_gamma1 = labels_for_gamma(test["target_prob"].numpy(), test["draft_prob"].numpy(), 1.0)
        metrics = {
            "auc_source": "held-out test prompts (--test-data)", "auc": test_auc, **rates,
            "fpr_gamma1": rates_at(test_gamma1, test_scores, args.eta)["fpr"],
            "test_prompts": len(test["prompt_ids"]),
            "validation": {"auc": report["val_auc"], **report["val_rates"]},
        }
        by_kind = {}
        kinds = test["kind"].numpy()
        for index, kind in enumerate(meta.get("kinds", [])):
            mask = kinds == index
            if mask.any() and 0 < test_labels[mask].mean() < 1:
                by_kind[kind] = roc_auc(test_labels[mask], test_scores[mask])
        metrics["auc_by_kind"] = by_kind

    target_name, draft_name = meta["target"], meta["draft"]
    name = default_verifier_path(target_name, draft_name, args.gamma).name
    out_dir = Path(args.out).expanduser() if args.out else default_verifier_path(target_name, draft_name, args.gamma).parent
    verifier_meta = {
        **{k: meta[k] for k in ("feature_set", "dim", "target", "draft", "hidden_size", "scalar_features") if k in meta},
        "gamma": args.gamma,
        "eta": args.eta,
        "hidden_units": args.hidden,
        "sampling": meta.get("sampling"),
        "metrics": {k: v for k, v in metrics.items()},
        "training": {k: v for k, v in report.items() if k != "history"},
    }
    path = save_verifier(out_dir / name, net, verifier_meta)
    plot = plot_roc(curves, points, out_dir / "roc.png")
    record = {
        "verifier": str(path),
        "roc_plot": str(plot),
        "auc": metrics["auc"],
        "tpr": metrics["tpr"],
        "fpr": metrics["fpr"],
        "gamma": args.gamma,
        "eta": args.eta,
        **{k: v for k, v in metrics.items() if k not in ("auc", "tpr", "fpr")},
        "target": target_name,
        "draft": draft_name,
        "feature_set": meta.get("feature_set"),
        "hidden_units": args.hidden,
        "train_samples": report["train_samples"],
        "val_samples": report["val_samples"],
        "train_seconds": report["train_seconds"],
        "best_epoch": report["best_epoch"],
        "roc_points": {label: {"fpr": [float(x) for x in c[0][:: max(1, len(c[0]) // 200)]], "tpr": [float(x) for x in c[1][:: max(1, len(c[1]) // 200)]]} for label, c in curves.items()},
        "command": " ".join(sys.argv),
    }
    write_json(out_dir / "train.json", record)
    print(json.dumps({k: record[k] for k in ("verifier", "auc", "tpr", "fpr", "gamma", "eta", "auc_source")}, indent=1))
    return 0


def _seeds(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def run_eval(args) -> int:
    from verispec.core.sampling import SamplingParams
    from verispec.engine.decoder import SpeculativeDecoder, _as_adapter
    from verispec.sprinter.collect import make_oracle
    from verispec.sprinter.decoder import SprinterDecoder
    from verispec.sprinter.evaluate import evaluate_against_sd, real_pair_tv, timestamp, toy_distribution_check
    from verispec.sprinter.features import make_extractor
    from verispec.sprinter.train import load_verifier, write_json

    _set_threads(args.threads)
    target, tokenizer, draft = _load_pair(args)
    extractor = make_extractor(target, draft)
    trained = load_verifier(args.verifier, eta=args.eta, extractor=extractor)
    sampling = trained.meta.get("sampling") or {}
    temperature = args.temperature if args.temperature is not None else float(sampling.get("temperature", 1.0))
    if sampling and abs(temperature - float(sampling.get("temperature", temperature))) > 1e-9:
        print(f"warning: the verifier was trained on data sampled at temperature {sampling.get('temperature')}, decoding at {temperature}", file=sys.stderr)
    prompts = select_prompts(args, tokenizer)
    adapter = _as_adapter(target)
    common = dict(tokenizer=tokenizer, temperature=temperature, top_k=args.top_k, top_p=args.top_p, max_new_tokens=args.max_new_tokens)
    sprinter = SprinterDecoder(adapter, draft, trained, eta=args.eta, max_run=args.max_run, extractor=extractor, **common)
    sd = SpeculativeDecoder(adapter, draft, method="sd", num_drafts=1, draft_len=args.sd_draft_len, **common)
    ar = None if args.no_ar else SpeculativeDecoder(adapter, None, method="ar", **common)
    log = lambda m: print(m, file=sys.stderr)  # noqa: E731
    result = evaluate_against_sd(sprinter, sd, prompts, ar_decoder=ar, seeds=_seeds(args.seeds), log=log)
    if args.tv_positions > 0:
        params = SamplingParams(temperature, args.top_k, args.top_p)
        oracle = make_oracle(draft, adapter.vocab_size, params)
        first_seed = _seeds(args.seeds)[0]
        # SD's outputs are exact target samples: their prefixes are the contexts of the TV estimate
        by_prompt = {row["prompt_id"]: row["sd"]["token_ids"] for row in result["rows"] if row["seed"] == first_seed}
        continuations = [by_prompt[p.prompt_id] for p in prompts]
        result["tv"] = real_pair_tv(
            adapter, oracle, sprinter.verifier, [p.ids for p in prompts], continuations, params,
            trained.meta.get("metrics", {}).get("fpr_gamma1"), positions_per_prompt=args.tv_positions,
            support_mass=1.0 if draft == "ngram" else 1.0 - 1e-6,
        )
        log(f"TV(SPRINTER, target) {result['tv']['mean_tv_sprinter_vs_target']:.4f}, theory {result['tv']['mean_theory_fpr_times_tv']}")
    if not args.no_toy_check:
        result["toy_check"] = toy_distribution_check(tpr=float(trained.meta["metrics"].get("tpr", 0.8)), fpr=float(trained.meta["metrics"].get("fpr", 0.3)))
    result.update(
        {
            "verifier": str(args.verifier),
            "verifier_metrics": trained.meta.get("metrics"),
            "gamma": trained.gamma,
            "eta": sprinter.eta,
            "max_run": args.max_run,
            "sd_draft_len": args.sd_draft_len,
            "temperature": temperature,
            "max_new_tokens": args.max_new_tokens,
            "target": extractor.target_name,
            "draft": extractor.draft_name,
            "date": timestamp(),
            "command": " ".join(sys.argv),
        }
    )
    path = write_json(Path(args.out) / "eval.json", result)
    keys = ("speedup_vs_sd", "speedup_vs_sd_with_prefill", "tokens_per_target_call", "sd_tokens_per_target_call", "rouge1", "rouge2", "rougeL", "rouge_headline")
    print(json.dumps({k: result[k] for k in keys} | ({"speedup_vs_ar": result["speedup_vs_ar"]} if "speedup_vs_ar" in result else {}) | {"eval_json": str(path)}, indent=1))
    return 0


def run_sprinter(args) -> int:
    if args.sprinter_command == "collect":
        return run_collect(args)
    if args.sprinter_command == "train":
        return run_train(args)
    if args.sprinter_command == "eval":
        return run_eval(args)
    raise ConfigError(f"unknown sprinter command {args.sprinter_command!r}")


# ----- verispec generate --method sprinter ---------------------------------------------------------
def find_default_verifier(target_name: str, draft_name: str) -> Path:
    from verispec.sprinter.train import default_verifier_path

    folder = default_verifier_path(target_name, draft_name, 1.2).parent
    candidates = sorted(folder.glob(f"{target_name}__{draft_name}__g*.pt")) if folder.is_dir() else []
    if not candidates:
        raise ConfigError(
            f"method sprinter needs a verifier: pass --verifier PATH, or train one for target {target_name!r} / draft "
            f"{draft_name!r} with `verispec sprinter train` (default location {folder})"
        )
    preferred = [c for c in candidates if c.name.endswith("__g1.2.pt")]
    return (preferred or candidates)[0]


def run_generate_sprinter(args) -> int:
    """``verispec generate --method sprinter --verifier PATH``: decode one prompt with SPRINTER."""
    from verispec.models.default import encode_prompt
    from verispec.cli.generate import prepare_output_file
    from verispec.sprinter.decoder import SprinterDecoder
    from verispec.sprinter.features import make_extractor, model_identifier

    from verispec.sprinter.decoder import SPRINTER_ON_LLAMACPP

    if getattr(args, "backend", "auto") == "llamacpp":  # before any model is loaded
        raise ConfigError(SPRINTER_ON_LLAMACPP)
    prepare_output_file(getattr(args, "stats_json", None))
    target, tokenizer, draft = _load_pair(args)
    extractor = make_extractor(target, draft)
    verifier = args.verifier or find_default_verifier(model_identifier(target), extractor.draft_name)
    decoder = SprinterDecoder(
        target, draft, verifier, tokenizer=tokenizer, temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
        draft_temperature=getattr(args, "draft_temperature", None), max_new_tokens=args.max_new_tokens,
        stop=getattr(args, "stop", ()), seed=args.seed, extractor=extractor,
        max_run=getattr(args, "max_run", None) or 32, backend=getattr(args, "backend", "auto"),
    )
    trained_at = (getattr(getattr(decoder.verifier, "trained", None), "meta", {}) or {}).get("sampling") or {}
    if "temperature" in trained_at and abs(float(trained_at["temperature"]) - args.temperature) > 1e-9:
        print(
            f"warning: the verifier was trained on data sampled at temperature {trained_at['temperature']}, "
            f"decoding at {args.temperature}; pass --temperature {trained_at['temperature']} to match",
            file=sys.stderr,
        )
    prompt_ids = encode_prompt(tokenizer, args.prompt, chat=not getattr(args, "no_chat", False))
    from verispec.cli.generate import decode_and_print

    output = decode_and_print(decoder, prompt_ids, getattr(args, "stream", False))
    summary = output.verifier_summary()
    print(
        f"[sprinter eta={output.eta:g} max_run={output.max_run}] {output.new_tokens} tokens, {output.target_calls} target calls, "
        f"{output.tokens_per_target_call:.2f} tokens/target call, verifier accept rate {summary['verifier_accept_rate']:.2f}, "
        f"{output.tokens_per_second:.1f} tokens/s (LOSSY: not an exact sample of the target)",
        file=sys.stderr,
    )
    if getattr(args, "stats_json", None):
        with open(args.stats_json, "w") as handle:
            json.dump(output.to_dict(), handle, indent=1)
    return 0
