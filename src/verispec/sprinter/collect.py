"""Training data for SPRINTER's verifier (ALGORITHMS.md §11 "Training").

For each training prompt, prefixes of the four kinds of the paper in equal proportion:

* ``original``: the prompt itself (where generation starts);
* ``draft``:    prompt + a continuation sampled from the draft q;
* ``target``:   prompt + a continuation sampled from the target p;
* ``mixed``:    prompt + a target continuation + a draft continuation after it.

At each chosen prefix a token x ~ q(.|prefix) is drawn and stored with its features (the
pair's ``FeatureExtractor``), q(x) and p(x). Labels are computed at training time for any gamma:
acceptable iff q(x)/p(x) <= gamma (``train.labels_for_gamma``). p and q are the *processed*
distributions (temperature / top-k / top-p) that decoding will use, so collect with the sampling
parameters you will decode with.

Target cost per prompt: one prefill, one forward over the draft continuation (all its p rows at
once), ``continuation_len`` single-token forwards for the target continuation, and one forward
over the mixed continuation. Collect from prompts disjoint from the evaluation prompts.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np
import torch

from verispec.core.rng import SeededRng
from verispec.core.sampling import SamplingParams, logits_to_probs, process_probs
from verispec.errors import ConfigError
from verispec.models.ngram import NGramDraft
from verispec.sprinter.features import DraftState, FeatureExtractor, HiddenStateTap

KINDS = ("original", "draft", "target", "mixed")


@dataclass
class CollectConfig:
    samples_per_kind: int = 12  # per prompt and kind
    continuation_len: int = 24  # length of the draft / target / mixed continuations
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0

    @property
    def params(self) -> SamplingParams:
        return SamplingParams(self.temperature, self.top_k, self.top_p)


class NGramOracle:
    """q rows of the n-gram draft at arbitrary prefixes (no hidden state)."""

    def __init__(self, vocab_size: int, params: SamplingParams, max_n: int = 3):
        self.model = NGramDraft(vocab_size, max_n=max_n)
        self.params = params

    def rows(self, context: Sequence[int], continuation: Sequence[int]):
        """q(.|context + continuation[:j]) for j = 0..n: ((n+1, V), None)."""
        self.model.reset(context)
        raw = np.stack([self.model.probs(continuation[:j]) for j in range(len(continuation) + 1)])
        return process_probs(raw, self.params), None

    def sample(self, context: Sequence[int], length: int, rng):
        """A continuation x_1..x_n ~ q and the rows it was drawn from: (tokens, (n, V), None)."""
        self.model.reset(context)
        tokens, rows = [], []
        for _ in range(length):
            row = process_probs(self.model.probs(tokens)[None], self.params)[0]
            tokens.append(rng.categorical(row))
            rows.append(row)
        return tokens, np.stack(rows), None


class NeuralOracle:
    """q rows and last hidden states of a neural draft (``HFModelAdapter``) at arbitrary prefixes."""

    def __init__(self, adapter, params: SamplingParams):
        self.adapter = adapter
        self.params = params
        self.tap = HiddenStateTap(adapter.model)

    def rows(self, context, continuation):
        self.adapter.reset(list(context))
        count = len(continuation) + 1
        logits = self.adapter.score([-1, *continuation], list(range(-1, count - 1)))
        return logits_to_probs(logits, self.params), self.tap.rows(count)

    def sample(self, context, length, rng):
        self.adapter.reset(list(context))
        tokens, rows, hidden = [], [], []
        parent = -1
        for step in range(length):
            logits = self.adapter.extend([-1] if step == 0 else [tokens[-1]], [parent])
            hidden.append(self.tap.rows(1)[0])
            row = logits_to_probs(logits, self.params)[0]
            rows.append(row)
            tokens.append(rng.categorical(row))
            parent = step
        return tokens, np.stack(rows), np.stack(hidden)


def make_oracle(drafter_model, vocab_size: int, params: SamplingParams):
    """The draft side of collection: 'ngram' or an ``HFModelAdapter`` / transformers model."""
    if drafter_model is None or isinstance(drafter_model, str):
        return NGramOracle(vocab_size, params)
    from verispec.engine.decoder import _as_adapter

    return NeuralOracle(_as_adapter(drafter_model), params)


class Collector:
    """Collects (features, q(x), p(x)) samples for one target / draft pair."""

    def __init__(self, target_adapter, draft_oracle, extractor: FeatureExtractor, config: CollectConfig):
        self.target = target_adapter
        self.draft = draft_oracle
        self.extractor = extractor
        self.config = config
        self.params = config.params

    def _target_rows(self, nodes: Sequence[int]) -> np.ndarray:
        """p at the pending root and after each of ``nodes`` (a chain), one forward: (n+1, V)."""
        logits = self.target.score([-1, *nodes], list(range(-1, len(nodes))))
        return logits_to_probs(logits, self.params)

    def prompt_samples(self, prompt_ids: Sequence[int], rng: SeededRng, choice: np.random.Generator) -> list[dict]:
        """Samples of the four kinds for one prompt (``samples_per_kind`` each)."""
        cfg = self.config
        prompt = [int(t) for t in prompt_ids]
        length = cfg.continuation_len
        self.target.reset(prompt)

        # original + draft kinds: a draft continuation scored by the target in one forward
        draft_tokens, draft_rows, draft_hidden = self.draft.sample(prompt, length, rng)
        target_rows = self._target_rows(draft_tokens)
        prefixes = {"original": [], "draft": [], "target": [], "mixed": []}
        for j in range(length):
            kind = "original" if j == 0 else "draft"
            prefixes[kind].append((prompt + draft_tokens[:j], draft_rows[j], None if draft_hidden is None else draft_hidden[j], target_rows[j]))

        # target kind (and the split for mixed): sample the target continuation token by token
        split = int(choice.integers(1, length))
        target_tokens: list[int] = []
        for j in range(length):
            if j == split:
                mixed_tokens, mixed_rows, mixed_hidden = self.draft.sample(prompt + target_tokens, length, rng)
                rows = self._target_rows(mixed_tokens)
                for i in range(1, length):
                    context = prompt + target_tokens + mixed_tokens[:i]
                    prefixes["mixed"].append((context, mixed_rows[i], None if mixed_hidden is None else mixed_hidden[i], rows[i]))
                p_row = rows[0]
            else:
                p_row = self._target_rows([])[0]
            if j > 0:
                prefixes["target"].append((prompt + target_tokens, None, None, p_row))
            token = rng.categorical(p_row)
            self.target.commit([], token)
            target_tokens.append(token)

        # q along the target continuation (one pass of the draft over it)
        q_rows, q_hidden = self.draft.rows(prompt, target_tokens[:-1])
        prefixes["target"] = [
            (context, q_rows[len(context) - len(prompt)], None if q_hidden is None else q_hidden[len(context) - len(prompt)], p_row)
            for context, _, _, p_row in prefixes["target"]
        ]

        samples = []
        for kind_index, kind in enumerate(KINDS):
            options = prefixes[kind]
            if kind == "original":
                picks = [0] * cfg.samples_per_kind  # one prefix: several draws of x
            else:
                picks = choice.choice(len(options), size=min(cfg.samples_per_kind, len(options)), replace=False)
            for pick in picks:
                context, q_row, hidden, p_row = options[int(pick)]
                token = rng.categorical(q_row)
                state = DraftState(np.asarray(context, dtype=np.int64), q_row, hidden)
                samples.append(
                    {
                        "features": self.extractor.features(state, [token])[0],
                        "token": token,
                        "draft_prob": float(q_row[token]),
                        "target_prob": float(p_row[token]),
                        "kind": kind_index,
                        "position": len(context) - len(prompt),
                    }
                )
        return samples

    def collect(self, prompts: Sequence[tuple[str, Sequence[int]]], log=print) -> dict:
        """prompts: (prompt id, token ids) pairs. Returns the dataset dict (``save_dataset``)."""
        if not prompts:
            raise ConfigError("no prompts to collect from; check the prompt selection")
        rng = SeededRng(self.config.seed)
        choice = np.random.default_rng([self.config.seed, 17])
        rows: list[dict] = []
        prompt_index: list[int] = []
        start = time.perf_counter()
        for index, (prompt_id, ids) in enumerate(prompts):
            tic = time.perf_counter()
            samples = self.prompt_samples(ids, rng, choice)
            rows += samples
            prompt_index += [index] * len(samples)
            log(f"[{index + 1}/{len(prompts)}] prompt {prompt_id}: {len(ids)} tokens, {len(samples)} samples, {time.perf_counter() - tic:.1f} s")
        return {
            "features": torch.from_numpy(np.stack([r["features"] for r in rows]).astype(np.float16)),
            "token": torch.tensor([r["token"] for r in rows], dtype=torch.long),
            "draft_prob": torch.tensor([r["draft_prob"] for r in rows], dtype=torch.float64),
            "target_prob": torch.tensor([r["target_prob"] for r in rows], dtype=torch.float64),
            "kind": torch.tensor([r["kind"] for r in rows], dtype=torch.int8),
            "position": torch.tensor([r["position"] for r in rows], dtype=torch.long),
            "prompt_index": torch.tensor(prompt_index, dtype=torch.long),
            "prompt_ids": [str(p) for p, _ in prompts],
            "meta": {
                **self.extractor.spec(),
                "kinds": list(KINDS),
                "config": asdict(self.config),
                "sampling": asdict(self.params),
                "seconds": time.perf_counter() - start,
            },
        }


def save_dataset(dataset: dict, path) -> None:
    from pathlib import Path

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(dataset, path)


def load_dataset(path) -> dict:
    from pathlib import Path

    path = Path(path).expanduser()
    if not path.is_file():
        raise ConfigError(f"SPRINTER data file {str(path)!r} not found; create it with `verispec sprinter collect --out DIR`")
    data = torch.load(path, map_location="cpu", weights_only=False)
    if not isinstance(data, dict) or "features" not in data or "meta" not in data:
        raise ConfigError(f"{path} is not a SPRINTER data file (made by `verispec sprinter collect`)")
    return data


def label_summary(dataset: dict, gammas=(1.0, 1.2, 1.5)) -> dict:
    """Fraction of acceptable tokens per kind and gamma."""
    from verispec.sprinter.train import labels_for_gamma

    kinds = dataset["kind"].numpy()
    out = {}
    for gamma in gammas:
        labels = labels_for_gamma(dataset["target_prob"].numpy(), dataset["draft_prob"].numpy(), gamma)
        out[f"gamma={gamma:g}"] = {"all": float(labels.mean()), **{kind: float(labels[kinds == i].mean()) for i, kind in enumerate(KINDS) if (kinds == i).any()}}
    return out
