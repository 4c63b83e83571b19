"""SPRINTER decoding (ALGORITHMS.md §11 "Inference"): LOSSY by design.

Each round drafts token by token. The verifier scores every drafted token x; while it accepts
(score >= eta), x is kept with no target call and drafting continues. At the first token it
rejects, the target is called ONCE: that forward processes every token kept since its last call
(they wait in the target adapter's pending tail, ``HFModelAdapter.append_committed``, so its KV
cache stays consistent with the emitted text) and its last row gives p at the rejected
position; the token then gets the standard test (keep with min(1, p(x)/q(x)), else y ~
norm([p - q]_+)), exactly ``verify.sprinter.sprinter_target_check``.

``max_run`` (default 32) caps a run of verifier-accepted tokens: when the verifier accepts
``max_run`` tokens in a row, the target is called once on them and a bonus token is drawn from
p after the run, as in the block form of ``verify.sprinter.Sprinter`` (L = max_run). Without a
cap an over-confident verifier would never consult the target. A round that reaches
max_new_tokens, an EOS token or the context limit inside a verifier-accepted run ends without a
target call (those tokens are final anyway).

Statistics: one ``SprinterStepStats`` per round (= per target call; a final round cut short by
the stopping rule may have target_calls = 0); ``SprinterOutput.block_efficiency`` is tokens per
target call (prefill excluded); ``flops`` estimates draft, verifier and target FLOPs.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field

import numpy as np

from verispec.core.rng import SeededRng
from verispec.core.sampling import SamplingParams, logits_to_probs
from verispec.engine.decoder import TextDecoding, _as_adapter
from verispec.engine.results import GenerationOutput, StepStats
from verispec.engine.drafters import ModelDrafter, NGramDrafter
from verispec.engine.streaming import stop_cut
from verispec.errors import ConfigError
from verispec.sprinter.features import DraftState, FeatureExtractor, HiddenStateTap, hf_model, make_extractor, model_identifier
from verispec.verify.sprinter import check_threshold, sprinter_target_check

DEFAULT_MAX_RUN = 32


# ----- verifiers as the decoder sees them ------------------------------------------------------
class FeatureVerifier:
    """A trained verifier (``train.TrainedVerifier``) behind a feature extractor: accepts x
    without the target iff its score >= eta (deterministic: probability 0 or 1)."""

    def __init__(self, trained, extractor: FeatureExtractor):
        from verispec.sprinter.features import check_compatible

        check_compatible(trained.meta, extractor)
        self.trained = trained
        self.extractor = extractor
        self.eta = trained.eta
        self.flops_per_score = trained.net.flops_per_score()

    def scores(self, state: DraftState, tokens) -> np.ndarray:
        return self.trained.scores(self.extractor.features(state, tokens))

    def accept_probability(self, state: DraftState, token: int) -> float:
        return 1.0 if self.scores(state, [token])[0] >= self.eta else 0.0


class HiddenStateModelDrafter(ModelDrafter):
    """A ``ModelDrafter`` that also keeps the draft's last hidden state for every prefix it
    scored this round (read from the output layer's input by a forward pre-hook)."""

    def __init__(self, adapter, params: SamplingParams):
        super().__init__(adapter, params)
        self.tap = HiddenStateTap(adapter.model)
        self.hidden: dict[tuple[int, ...], np.ndarray] = {}

    def begin_round(self):
        self.hidden = {}
        return super().begin_round()

    def _score(self, prefixes):
        rows = super()._score(prefixes)
        for prefix, row in zip(prefixes, self.tap.rows(len(prefixes))):
            self.hidden[tuple(prefix)] = row
        return rows


# ----- statistics --------------------------------------------------------------------------------
@dataclass
class SprinterStepStats(StepStats):
    """One round. accepted_len = N, tokens kept by the verifier without the target;
    new_tokens = N + 1 (the target-decided or bonus token) before truncation; target_kept: the
    target kept the verifier-rejected draft token (None for a capped or cut-short round)."""

    verifier_calls: int = 0
    capped: bool = False
    target_kept: bool | None = None
    target_tokens_fed: int = 0
    residual_guard_hits: int = 0


@dataclass
class SprinterOutput(GenerationOutput):
    """``GenerationOutput`` plus SPRINTER's counters and FLOP estimates."""

    eta: float = 0.5
    max_run: int = DEFAULT_MAX_RUN
    flops: dict = field(default_factory=dict)

    @property
    def tokens_per_target_call(self) -> float:
        return self.block_efficiency

    def verifier_summary(self) -> dict:
        calls = sum(s.verifier_calls for s in self.steps)
        accepted = sum(s.accepted_len for s in self.steps)
        checks = [s.target_kept for s in self.steps if s.target_kept is not None]
        return {
            "verifier_calls": calls,
            "verifier_accept_rate": accepted / calls if calls else 0.0,
            "target_checks": len(checks),
            "target_kept_rate": float(np.mean(checks)) if checks else 0.0,
            "capped_rounds": sum(s.capped for s in self.steps),
            "mean_run_length": self.mean_accepted_len,
        }

    def to_dict(self) -> dict:
        out = super().to_dict()
        out.update(
            {
                "eta": self.eta,
                "max_run": self.max_run,
                "tokens_per_target_call": self.tokens_per_target_call,
                "flops": self.flops,
                "verifier": self.verifier_summary(),
            }
        )
        return out


def transformer_flop_counts(model) -> dict:
    """Per-token FLOP coefficients of a decoder-only transformer: 2 x non-embedding parameters
    (body), 2 x hidden x vocab per logits row (output layer), 4 x layers x hidden per attended
    context token (QK^T and AV)."""
    inner = hf_model(model)
    config = inner.config
    embed = inner.get_input_embeddings().weight
    head = inner.get_output_embeddings()
    total = sum(p.numel() for p in inner.parameters())
    non_embedding = total - embed.numel() - (head.weight.numel() if head is not None and head.weight is not embed else 0)
    return {
        "body_per_token": 2 * non_embedding,
        "head_per_row": 2 * int(config.hidden_size) * int(config.vocab_size),
        "attention_per_context_token": 4 * int(config.num_hidden_layers) * int(config.hidden_size),
    }


class _FlopMeter:
    def __init__(self, coefficients: dict | None):
        self.coefficients = coefficients
        self.flops = 0.0

    def forward(self, tokens: int, context_end: int, logits_rows: int) -> None:
        if self.coefficients is None:
            return
        c = self.coefficients
        mean_context = context_end - tokens / 2.0
        self.flops += tokens * (c["body_per_token"] + c["attention_per_context_token"] * mean_context) + logits_rows * c["head_per_row"]


# ----- the decoder -------------------------------------------------------------------------------
SPRINTER_ON_LLAMACPP = (
    "SPRINTER's verifier reads the target's hidden states, which the llamacpp backend does not return; "
    "run SPRINTER on torch (--backend auto with a model directory or the default target), or pick a lossless "
    "rule on llamacpp"
)


class SprinterDecoder(TextDecoding):
    """SPRINTER with a learned (or test) verifier; see the module docstring.

    target:   a transformers causal LM or an ``HFModelAdapter``.
    draft:    "ngram" (default; the training-free n-gram draft) or a neural draft model/adapter.
    verifier: a ``train.TrainedVerifier``, a path to a verifier file, or any object with
              ``accept_probability(state: DraftState, token) -> float`` (used by the exact
              tests: idealised / oracle verifiers).
    eta:      the verifier threshold in (0, 1) (default: the one stored in the file).
    max_run:  longest run of verifier-accepted tokens before the target is called anyway.
    """

    method = "sprinter"

    def __init__(
        self,
        target,
        draft="ngram",
        verifier=None,
        tokenizer=None,
        eta: float | None = None,
        max_run: int = DEFAULT_MAX_RUN,
        temperature: float = 1.0,
        top_k: int = 0,
        top_p: float = 1.0,
        draft_temperature: float | None = None,
        max_new_tokens: int = 128,
        eos_token_id: int | Sequence[int] | None = None,
        stop: Sequence[str] = (),
        seed: int = 0,
        device=None,
        extractor: FeatureExtractor | None = None,
        backend: str = "auto",
    ):
        self._set_up(target, tokenizer, temperature, top_k, top_p, draft_temperature, max_new_tokens,
                     eos_token_id, stop, seed, device, backend)
        if self.target.backend == "llamacpp":
            raise ConfigError(SPRINTER_ON_LLAMACPP)
        if int(max_run) != max_run or max_run < 1:
            raise ConfigError(f"max_run must be an integer >= 1, got {max_run!r}")
        self.max_run = int(max_run)
        self.drafter = self._make_drafter(draft, device)
        if self.drafter.vocab_size != self.target.vocab_size:
            raise ConfigError(
                f"draft vocabulary has {self.drafter.vocab_size} tokens but the target has {self.target.vocab_size}; "
                "SPRINTER needs one shared tokenizer/vocabulary"
            )
        self.verifier = self._make_verifier(verifier, eta, extractor)
        self.eta = float(getattr(self.verifier, "eta", eta if eta is not None else 0.5))
        self.target_flops = _FlopMeter(transformer_flop_counts(self.target.model))
        draft_model = getattr(self.drafter, "adapter", None)
        self.draft_flops = _FlopMeter(None if draft_model is None else transformer_flop_counts(draft_model.model))
        self.last_output: SprinterOutput | None = None

    def _make_drafter(self, draft, device):
        if draft is None or (isinstance(draft, str) and draft in ("ngram", "default")):
            return NGramDrafter(self.target.vocab_size, self.draft_params)
        if isinstance(draft, str):
            raise ConfigError(f"unknown draft {draft!r}: give 'ngram' or a draft model")
        if isinstance(draft, (NGramDrafter, ModelDrafter)):
            return draft
        return HiddenStateModelDrafter(_as_adapter(draft, device, self.backend), self.draft_params)

    def _make_verifier(self, verifier, eta, extractor):
        if eta is not None:
            check_threshold(eta)
        if verifier is None:
            raise ConfigError("SPRINTER needs a verifier: train one with `verispec sprinter train` and pass its file (--verifier PATH)")
        if hasattr(verifier, "accept_probability"):
            if eta is not None and hasattr(verifier, "eta"):
                verifier.eta = check_threshold(eta)
            return verifier
        from verispec.sprinter.train import TrainedVerifier, load_verifier

        if extractor is None:
            draft = self.drafter.adapter if isinstance(self.drafter, ModelDrafter) else "ngram"
            extractor = make_extractor(self.target.model, draft)
        if not isinstance(verifier, TrainedVerifier):
            verifier = load_verifier(verifier, eta=eta, extractor=extractor)
        elif eta is not None:
            verifier.eta = check_threshold(eta)
        return FeatureVerifier(verifier, extractor)

    @property
    def pair_names(self) -> tuple[str, str]:
        draft = self.drafter.adapter.model if isinstance(self.drafter, ModelDrafter) else "ngram"
        return model_identifier(self.target.model), model_identifier(draft)

    def _output(self, prompt_ids, generated, steps, start, prefill_seconds, stop_reason, text=None) -> SprinterOutput:
        verifier_calls = sum(s.verifier_calls for s in steps)
        flops = {
            "target": self.target_flops.flops,
            "draft": self.draft_flops.flops if self.draft_flops.coefficients else None,
            "draft_note": "n-gram draft: no neural FLOPs (numpy suffix matching)" if not self.draft_flops.coefficients else "",
            "verifier": float(verifier_calls * getattr(self.verifier, "flops_per_score", 0)),
            "target_tokens_fed": sum(s.target_tokens_fed for s in steps),
            "convention": "2 x non-embedding params per token + 2 H V per logits row + 4 n_layers H per attended token; prefill included",
        }
        return SprinterOutput(
            "sprinter", 1, self.max_run, prompt_ids, list(generated), self._decode(generated) if text is None else text, steps,
            time.perf_counter() - start, prefill_seconds, stop_reason, asdict(self.params), eta=self.eta, max_run=self.max_run, flops=flops,
        )

    def _run(self, prompt, rng=None) -> Iterator[SprinterOutput]:
        prompt_ids = self._encode(prompt)
        rng = SeededRng(self.seed) if rng is None else rng
        self.target_flops.flops = 0.0
        self.draft_flops.flops = 0.0
        start = time.perf_counter()
        self.target.reset(prompt_ids)
        self.target_flops.forward(len(prompt_ids) - 1, len(prompt_ids) - 1, 1 if len(prompt_ids) > 1 else 0)
        self.drafter.reset(prompt_ids)
        prefill_seconds = time.perf_counter() - start
        generated: list[int] = []
        steps: list[SprinterStepStats] = []
        while True:
            step, emitted, stop_reason = self._round(rng, prompt_ids, generated)
            tic = time.perf_counter()
            generated.extend(emitted)
            stop_reason = stop_reason or self._stop_reason(generated)
            if stop_reason:
                generated = self._truncate(generated)
            text, stopped = stop_cut(self._decode(generated), self.stop)
            if stopped:
                stop_reason = "stop_string"
            step.other_seconds += time.perf_counter() - tic
            steps.append(step)
            self.last_output = self._output(prompt_ids, generated, steps, start, prefill_seconds, stop_reason or "running", text)
            yield self.last_output
            if stop_reason:
                return

    def _target_probs(self, run: list[int], context_len: int) -> np.ndarray:
        """One target forward over the tokens kept since its last call: p(.|context + run), (V,)."""
        if run:
            self.target.append_committed(run[:-1], run[-1])
        logits = self.target.score([-1], [-1])
        self.target_flops.forward(len(run) + 1, context_len + len(run), 1)
        return logits_to_probs(logits, self.params)[0]

    def _round(self, rng, prompt_ids: list[int], generated: list[int]):
        """One round: returns (stats, emitted tokens, stop reason or "")."""
        draft_seconds = verify_seconds = target_seconds = 0.0
        context = list(prompt_ids) + list(generated)
        calls_before = self.drafter.calls
        draft_fn = self.drafter.begin_round()
        hidden = getattr(self.drafter, "hidden", None)
        run: list[int] = []
        verifier_calls = 0
        while True:
            if len(context) + len(run) + 2 >= self.target.max_context:
                return self._cut_round(run, verifier_calls, draft_seconds, verify_seconds, calls_before), run, "context"
            tic = time.perf_counter()
            calls = self.drafter.calls
            draft_probs = draft_fn(tuple(run))
            if self.drafter.calls > calls:  # a neural draft ran one forward (one new token, approx.)
                self.draft_flops.forward(1, len(context) + len(run), 1)
            token = rng.categorical(draft_probs)
            draft_seconds += time.perf_counter() - tic

            tic = time.perf_counter()
            state = DraftState(np.asarray(context + run, dtype=np.int64), draft_probs, None if hidden is None else hidden.get(tuple(run)))
            accepted = rng.bernoulli(self.verifier.accept_probability(state, token))
            verifier_calls += 1
            verify_seconds += time.perf_counter() - tic
            if not accepted:
                break
            run.append(token)
            if len(generated) + len(run) >= self.max_new_tokens or token in self.eos_ids:
                # the verifier's tokens are final: stop here, no target call needed
                return self._cut_round(run, verifier_calls, draft_seconds, verify_seconds, calls_before), run, ""
            if len(run) == self.max_run:
                break

        tic = time.perf_counter()
        target_probs = self._target_probs(run, len(context))
        target_seconds = time.perf_counter() - tic
        tic = time.perf_counter()
        capped = accepted  # the loop leaves with an accepted token only at the cap
        if capped:  # bonus token from p after the run (the block form's p_{L+1})
            next_token, kept, guard = rng.categorical(target_probs), None, False
        else:  # the standard test of the verifier-rejected token
            next_token, kept, guard = sprinter_target_check(rng, target_probs, draft_probs, token)
        verify_seconds += time.perf_counter() - tic

        tic = time.perf_counter()
        self.target.commit([], next_token)
        self.drafter.commit(run, next_token)
        step = SprinterStepStats(
            accepted_len=len(run),
            new_tokens=len(run) + 1,
            drafted_tokens=verifier_calls,
            tree_nodes=len(run) + 1,
            draft_seconds=draft_seconds,
            target_seconds=target_seconds,
            verify_seconds=verify_seconds,
            other_seconds=time.perf_counter() - tic,
            target_calls=1,
            draft_calls=self.drafter.calls - calls_before,
            verifier_calls=verifier_calls,
            capped=bool(capped),
            target_kept=kept,
            target_tokens_fed=len(run) + 1,
            residual_guard_hits=int(guard),
        )
        return step, run + [next_token], ""

    def _cut_round(self, run, verifier_calls, draft_seconds, verify_seconds, calls_before) -> SprinterStepStats:
        return SprinterStepStats(
            accepted_len=len(run),
            new_tokens=len(run),
            drafted_tokens=verifier_calls,
            tree_nodes=len(run),
            draft_seconds=draft_seconds,
            target_seconds=0.0,
            verify_seconds=verify_seconds,
            other_seconds=0.0,
            target_calls=0,
            draft_calls=self.drafter.calls - calls_before,
            verifier_calls=verifier_calls,
        )
