"""Are a llama.cpp batch's rows each sequence's solo rows? (models/llamacpp_batch.py)

Three sequences with prompts of different lengths are decoded round by round with random draft
trees and random accepted paths (a seeded script, the same for every run): first each alone in
its own context (``LlamaCppAdapter``), then together in one shared context (``LlamaCppBatch``),
every round's forwards of the live sequences as ONE ``llama_decode``; sequence 1 finishes after
round 3 and sequence 2 joins then. Printed: the largest |row difference| of every sequence
against its solo rows, for the batch as built (rejected cells retired to a garbage sequence,
prompts prefilled in the target's own context and copied in) and for two naive layouts (LAYOUTS).

    PYTHONPATH=src python benchmarks/llamacpp_batch_probe.py [--model default|PATH.gguf] [--rounds 8]
"""

from __future__ import annotations

import argparse
import random
import threading

import numpy as np

from verispec.models.llamacpp import LlamaCppAdapter, gguf_of_target
from verispec.models.llamacpp_batch import LlamaCppBatch, _Submission

PROMPT_LENGTHS = (9, 150, 70)  # 64 tokens or more: the prefill goes through llama.cpp's tiled flash attention
JOIN_ROUND = 3
# built: rejected cells retired, prompts prefilled in the target's own context and copied in;
# freed: rejected cells freed (holes refilled by later tokens out of position order);
# prefilled in place: a prompt's prefill computed in the shared cache (its cells not from cell 0)
LAYOUTS = ("built", "freed", "prefilled in place")  # sequence 1 leaves and sequence 2 joins after this round


def random_tree(rng: random.Random, vocab: int) -> tuple[list[int], list[int]]:
    """(tokens, parents) of a tree rooted at the pending root (-1, -1 first), 1 to 9 nodes."""
    tokens, parents = [-1], [-1]
    for node in range(1, rng.randint(1, 9)):
        tokens.append(rng.randrange(3, vocab))
        parents.append(rng.randrange(0, node))
    return tokens, parents


def random_path(rng: random.Random, parents: list[int]) -> list[int]:
    """A root-to-node path (root excluded) ending at a random node."""
    node, path = rng.randrange(0, len(parents)), []
    while node > 0:
        path.append(node)
        node = parents[node]
    return path[::-1]


def scripts(rounds: int, vocab: int, seed: int) -> list[dict]:
    """Each sequence's prompt and rounds: (tree tokens, parents, commit path, next token)."""
    rng = random.Random(seed)
    out = []
    for length in PROMPT_LENGTHS:
        steps = []
        for _ in range(rounds):
            tokens, parents = random_tree(rng, vocab)
            steps.append((tokens, parents, random_path(rng, parents), rng.randrange(3, vocab)))
        out.append({"prompt": [rng.randrange(3, vocab) for _ in range(length)], "steps": steps})
    return out


def run_round(adapter, step) -> np.ndarray:
    tokens, parents, path, next_token = step
    rows = adapter.extend(tokens, parents).numpy()
    adapter.commit(path, next_token)
    return rows


def solo_rows(path, script, options) -> list[np.ndarray]:
    adapter = LlamaCppAdapter(path, **options)
    adapter.reset(script["prompt"])
    rows = [run_round(adapter, step) for step in script["steps"]]
    adapter.close()
    return rows


def prefill_in_place(batch: LlamaCppBatch, seq: int, prompt: list[int]) -> None:
    """A prompt's prefill computed in the shared cache itself (its cells after the others')."""
    body = prompt[:-1]
    entries = _Submission(body, list(range(len(body))), [[seq]] * len(body), [False] * len(body))
    batch.decode(entries, batch.target.prefill_batch)


def batch_rows(path, all_scripts, options, layout: str) -> list[list[np.ndarray]]:
    """Rows of every sequence decoded together (sequence 1 leaves, 2 joins after JOIN_ROUND)."""
    target = LlamaCppAdapter(path, **options)
    batch = LlamaCppBatch(target, slots=2)
    if layout == "freed":  # rejected cells freed, as a solo adapter does
        lib, memory = batch._llama, batch._memory
        batch.retire = lambda seq, position: lib.llama_memory_seq_rm(memory, seq, position, -1)
    elif layout == "prefilled in place":
        batch.prefill = lambda seq, prompt: prefill_in_place(batch, seq, prompt)
    rows: list[list[np.ndarray]] = [[] for _ in all_scripts]
    live, step_of = {}, {}
    barrier: list[threading.Barrier] = []

    def wait():
        barrier[0].wait()  # submitted
        barrier[1].wait()  # flushed

    def join(i):
        live[i] = batch.open(wait=wait)
        live[i].reset(all_scripts[i]["prompt"])
        step_of[i] = 0

    join(0)
    join(1)
    for round_ in range(len(all_scripts[0]["steps"]) * 2):
        if round_ == JOIN_ROUND:
            batch.close(live.pop(1))
            join(2)
        active = [i for i in live if step_of[i] < len(all_scripts[i]["steps"])]
        if not active:
            break
        barrier[:] = [threading.Barrier(len(active) + 1), threading.Barrier(len(active) + 1)]

        def work(i):
            rows[i].append(run_round(live[i], all_scripts[i]["steps"][step_of[i]]))
            step_of[i] += 1

        threads = [threading.Thread(target=work, args=(i,)) for i in active]
        for t in threads:
            t.start()
        barrier[0].wait()
        batch.flush()
        barrier[1].wait()
        for t in threads:
            t.join()
    batch.close_context()
    target.close()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="default")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--seeds", type=int, default=3)
    args = parser.parse_args()
    path = gguf_of_target(args.model)
    options = {"n_threads": 1}
    vocab = LlamaCppAdapter(path, **options).vocab_size
    print(f"model {path.name}; rounds {args.rounds}; prompts {PROMPT_LENGTHS}; seq 1 leaves, seq 2 joins after round {JOIN_ROUND}")
    print("| seed | layout | seq 0 max diff | seq 1 max diff | seq 2 max diff |")
    print("|---|---|---|---|---|")
    for seed in range(args.seeds):
        all_scripts = scripts(args.rounds, min(vocab, 2000), seed)
        solo = [solo_rows(path, s, options) for s in all_scripts]
        for layout in LAYOUTS:
            together = batch_rows(path, all_scripts, options, layout)
            diffs = []
            for i in range(len(all_scripts)):
                pairs = list(zip(together[i], solo[i]))
                diffs.append(max(float(np.abs(a - b).max()) for a, b in pairs) if pairs else float("nan"))
            print(f"| {seed} | {layout} | " + " | ".join(f"{d:.3g}" for d in diffs) + " |")


if __name__ == "__main__":
    main()
