"""Summary table of a SPRINTER run (ALGORITHMS.md §11) from the files `verispec sprinter train` and
`verispec sprinter eval` wrote: the verifier's AUC / TPR / FPR, tokens per target call,
speedup and ROUGE against SD, and the measured TV next to Thm 3.1's value.

    .venv/bin/python benchmarks/sprinter_eval.py runs/sprinter/verifier/train.json runs/sprinter/eval/eval.json
"""

from __future__ import annotations

import argparse
import json


def fmt(value, digits=3):
    return "-" if value is None else (f"{value:.{digits}f}" if isinstance(value, float) else str(value))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("train_json")
    parser.add_argument("eval_json")
    args = parser.parse_args()
    train = json.load(open(args.train_json))
    result = json.load(open(args.eval_json))
    lines = [
        ("verifier", f"{train['feature_set']}, {'linear' if not train['hidden_units'] else str(train['hidden_units']) + ' hidden'}, gamma {train['gamma']}, eta {train['eta']}"),
        ("AUC (" + train.get("auc_source", "") + ")", fmt(train["auc"])),
        ("TPR / FPR at eta", f"{fmt(train['tpr'])} / {fmt(train['fpr'])}  (FPR at gamma=1: {fmt(train.get('fpr_gamma1'))})"),
        ("training time (s)", fmt(train["train_seconds"], 1)),
        ("prompts x seeds", f"{result['prompts']} x {len(result['seeds'])}, max_new_tokens {result['max_new_tokens']}, T = {result['temperature']}"),
        ("tokens per target call: SPRINTER / SD", f"{fmt(result['tokens_per_target_call'], 2)} / {fmt(result['sd_tokens_per_target_call'], 2)} (SD L={result['sd_draft_len']})"),
        ("speedup vs SD (decoding / with prefill)", f"{fmt(result['speedup_vs_sd'], 2)} / {fmt(result['speedup_vs_sd_with_prefill'], 2)}"),
    ]
    if "speedup_vs_ar" in result:
        lines.append(("speedup vs plain sampling: SPRINTER / SD", f"{fmt(result['speedup_vs_ar'], 2)} / {fmt(result['sd_speedup_vs_ar'], 2)}"))
    if result.get("rouge_vs_reference"):
        ref = result["rouge_vs_reference"]
        for name in ("sprinter", "sd", "ar"):
            if name not in ref:
                continue
            lines.append((f"ROUGE-1/2/L vs reference: {name}", " / ".join(fmt(ref[name][k]) for k in ("rouge1", "rouge2", "rougeL"))))
    lines.append(("ROUGE-1/2/L SPRINTER vs SD", " / ".join(fmt(result["rouge_sprinter_vs_sd"][k]) for k in ("rouge1", "rouge2", "rougeL"))))
    if result.get("rouge_ar_vs_sd"):
        lines.append(("ROUGE-1/2/L plain sampling vs SD (noise floor)", " / ".join(fmt(result["rouge_ar_vs_sd"][k]) for k in ("rouge1", "rouge2", "rougeL"))))
    if result.get("tv"):
        tv = result["tv"]
        lines.append(("TV(SPRINTER, target), exact per context", f"{fmt(tv['mean_tv_sprinter_vs_target'])} mean over {tv['contexts']} contexts"))
        lines.append(("TV(draft, target)", fmt(tv["mean_tv_draft_vs_target"])))
        lines.append(("Thm 3.1 value FPR x TV(p, q)", fmt(tv["mean_theory_fpr_times_tv"])))
    if result.get("toy_check"):
        toy = result["toy_check"]
        lines.append(("toy check |law - (1-b)p - bq| / |TV - b TV(p,q)|", f"{toy['token_law_max_abs_error']:.1e} / {toy['tv_abs_error']:.1e}"))
    width = max(len(k) for k, _ in lines)
    for key, value in lines:
        print(f"{key:<{width}}  {value}")


if __name__ == "__main__":
    main()
