"""Hand-made engine outputs and prompt records for the metric and writer tests."""

from verispec.bench.metrics import PromptRecord
from verispec.engine.results import GenerationOutput, StepStats


def step(tau, draft_len=4, new_tokens=None, draft=0.1, target=0.15, verify=0.02, other=0.03):
    return StepStats(
        accepted_len=tau, new_tokens=tau + 1 if new_tokens is None else new_tokens, drafted_tokens=draft_len,
        tree_nodes=draft_len + 1, draft_seconds=draft, target_seconds=target, verify_seconds=verify, other_seconds=other,
    )


def output(method, taus, seconds, draft_len=4, num_drafts=1, prefill=0.1):
    """A GenerationOutput whose rounds kept ``taus`` (one token per round for 'ar')."""
    if method == "ar":
        steps = [step(0, 1, 1, draft=0.0, target=0.15, verify=0.0, other=0.05) for _ in taus]
        tokens = len(taus)
    else:
        steps = [step(tau, draft_len) for tau in taus]
        tokens = sum(tau + 1 for tau in taus)
    return GenerationOutput(method, num_drafts, draft_len, [1, 2, 3], list(range(tokens)), "", steps, seconds, prefill, "max_new_tokens")


def record(method, taus, seconds, seed=0, prompt_id="p0", category="c", dataset="d", temperature=0.0,
           draft_len=4, num_drafts=1):
    out = output(method, taus, seconds, draft_len=draft_len, num_drafts=num_drafts)
    return PromptRecord.from_output(out, dataset, category, prompt_id, temperature, seed)


def sweep_records():
    """A small sweep: 2 datasets (one with 2 categories) x 2 temperatures x 2 seeds x
    {ar, sd L=2/4, bv L=2/4, spectr K=2 L=2/4}, deterministic fake timings."""
    records = []
    prompts = {"humaneval": [("HumanEval/0", "humaneval"), ("HumanEval/1", "humaneval")],
               "spec_bench": [("81", "writing"), ("131", "math")]}
    for dataset, items in prompts.items():
        for temperature in (0.0, 0.7):
            for seed in (0, 1):
                for index, (prompt_id, category) in enumerate(items):
                    common = dict(seed=seed, prompt_id=prompt_id, category=category, dataset=dataset, temperature=temperature)
                    records.append(record("ar", [0] * 12, seconds=1.2 + 0.05 * index, **common))
                    for method, num_drafts, bonus in (("sd", 1, 0), ("bv", 1, 1), ("spectr", 2, 1)):
                        for draft_len in (2, 4):
                            taus = [min(draft_len, (seed + index + bonus + i) % (draft_len + 1)) for i in range(4)]
                            seconds = 0.6 + 0.1 * num_drafts + 0.02 * draft_len + 0.01 * seed
                            records.append(record(method, taus, seconds=seconds, draft_len=draft_len,
                                                  num_drafts=num_drafts, **common))
    return records
