"""The decoding loop: draft -> score -> verify -> commit (DESIGN.md §4).

``SpeculativeDecoder`` points a verification rule of the registry at a target model and a draft.
Each round: the drafter proposes a chain, K i.i.d. paths or a token tree (all randomness through
one seeded ``Rng``); the target scores every node in ONE forward with a tree attention mask;
sampling parameters are applied to both models' logits; target modifications left by GBV-mod /
SpecTr-GBV★ are applied (ALGORITHMS.md §4.3, §6.3); the verifier picks the accepted prefix and
one extra token; both KV caches keep the accepted path and drop the rest.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field

import numpy as np

from verispec.core.rng import SeededRng
from verispec.core.rows import LogitRows, draw_from
from verispec.core.sampling import SamplingParams
from verispec.core.tree import DraftScheme, DraftTree
from verispec.draft.samplers import DraftSkeleton, sample_iid_paths, sample_tree
from verispec.engine.drafters import Drafter, ModelDrafter, NGramDrafter
from verispec.errors import ConfigError
from verispec.verify.modification import advance_windows, modify_tree_targets
from verispec.verify.registry import MethodSpec, get_method

MAX_DRAFTS = 64
MAX_DRAFT_LEN = 64
OTM_MAX_TUPLES = 20_000


@dataclass
class StepStats:
    """One round. accepted_len = tau (draft tokens kept); new_tokens = tau + 1 before truncation
    at EOS / max_new_tokens; times in seconds."""

    accepted_len: int
    new_tokens: int
    drafted_tokens: int
    tree_nodes: int
    draft_seconds: float
    target_seconds: float
    verify_seconds: float
    other_seconds: float
    target_calls: int = 1
    draft_calls: int = 0


@dataclass
class GenerationOutput:
    """Result of ``generate``. Block efficiency = new tokens / target calls during decoding
    (prefill excluded, DESIGN.md §5)."""

    method: str
    num_drafts: int
    draft_len: int
    prompt_ids: list[int]
    token_ids: list[int]
    text: str
    steps: list[StepStats]
    seconds: float
    prefill_seconds: float
    stop_reason: str
    sampling: dict = field(default_factory=dict)

    @property
    def new_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def target_calls(self) -> int:
        return sum(step.target_calls for step in self.steps)

    @property
    def draft_calls(self) -> int:
        return sum(step.draft_calls for step in self.steps)

    @property
    def block_efficiency(self) -> float:
        return self.new_tokens / self.target_calls if self.target_calls else 0.0

    @property
    def mean_accepted_len(self) -> float:
        return float(np.mean([s.accepted_len for s in self.steps])) if self.steps else 0.0

    @property
    def acceptance_rate(self) -> float:
        """mean tau / L (DESIGN.md §5)."""
        return self.mean_accepted_len / self.draft_len if self.draft_len else 0.0

    def position_acceptance(self) -> list[float]:
        """a_i = P(tau >= i | tau >= i-1), i = 1..L, estimated over the rounds."""
        taus = np.array([s.accepted_len for s in self.steps])
        rates = []
        for i in range(1, self.draft_len + 1):
            reached = int((taus >= i - 1).sum())
            rates.append(float((taus >= i).sum() / reached) if reached else 0.0)
        return rates

    @property
    def tokens_per_second(self) -> float:
        return self.new_tokens / self.seconds if self.seconds > 0 else 0.0

    def time_breakdown(self) -> dict[str, float]:
        return {
            part: float(sum(getattr(s, f"{part}_seconds") for s in self.steps))
            for part in ("draft", "target", "verify", "other")
        }

    def to_dict(self) -> dict:
        return {
            "method": self.method,
            "K": self.num_drafts,
            "L": self.draft_len,
            "new_tokens": self.new_tokens,
            "token_ids": self.token_ids,
            "text": self.text,
            "target_calls": self.target_calls,
            "draft_calls": self.draft_calls,
            "block_efficiency": self.block_efficiency,
            "mean_accepted_len": self.mean_accepted_len,
            "acceptance_rate": self.acceptance_rate,
            "position_acceptance": self.position_acceptance(),
            "tokens_per_second": self.tokens_per_second,
            "seconds": self.seconds,
            "prefill_seconds": self.prefill_seconds,
            "time_breakdown": self.time_breakdown(),
            "stop_reason": self.stop_reason,
            "sampling": self.sampling,
            "steps": [asdict(step) for step in self.steps],
        }


def _as_adapter(model, device=None, backend: str = "auto"):
    from verispec.models.hf import HFModelAdapter

    return model if isinstance(model, HFModelAdapter) else HFModelAdapter(model, device=device, backend=backend)


class TextDecoding:
    """The public surface shared by the decoding loops (speculative and SPRINTER): ``generate``,
    ``stream``, prompt encoding and the stopping rules. Subclasses provide ``_run(prompt, rng)``,
    a generator of ``GenerationOutput`` snapshots that sets ``self.last_output``."""

    tokenizer = None
    eos_ids: set = set()
    max_new_tokens: int = 1
    last_output: GenerationOutput | None = None

    def _set_up(self, target, tokenizer, temperature, top_k, top_p, draft_temperature, max_new_tokens,
                eos_token_id, stop, seed, device, backend) -> None:
        """The settings every decoding loop shares: target adapter, sampling parameters of target
        and draft, output limits and stopping rules (EOS defaults to the tokenizer's)."""
        self.backend = backend
        self.target = _as_adapter(target, device, backend)
        self.tokenizer = tokenizer
        self.params = SamplingParams(temperature, top_k, top_p)
        self.draft_params = SamplingParams(temperature if draft_temperature is None else draft_temperature, top_k, top_p)
        if max_new_tokens < 1:
            raise ConfigError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        self.max_new_tokens = int(max_new_tokens)
        self.stop = tuple(stop)
        if eos_token_id is None and tokenizer is not None:
            eos_token_id = tokenizer.eos_token_id
        self.eos_ids = {int(e) for e in ([] if eos_token_id is None else np.atleast_1d(eos_token_id))}
        self.seed = seed
        self.last_output = None

    def generate(self, prompt: str | Sequence[int], rng=None) -> GenerationOutput:
        """Decode until max_new_tokens, an EOS token or a stop string. ``rng``: any ``Rng``
        (default ``SeededRng(self.seed)``), e.g. the replay enumerator for exact tests."""
        for _ in self._run(prompt, rng):
            pass
        return self.last_output

    def stream(self, prompt: str | Sequence[int]) -> Iterator[str]:
        """Yield text as blocks are accepted (the concatenation equals ``generate().text``)."""
        printed = ""
        for output in self._run(prompt):
            if output.text.startswith(printed) and len(output.text) > len(printed):
                yield output.text[len(printed) :]
                printed = output.text

    def _run(self, prompt, rng=None) -> Iterator[GenerationOutput]:  # pragma: no cover - abstract
        raise NotImplementedError

    def _encode(self, prompt) -> list[int]:
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise ConfigError("a text prompt needs a tokenizer; pass tokenizer= or token ids")
            from verispec.models.default import encode_prompt

            return encode_prompt(self.tokenizer, prompt)
        return [int(t) for t in prompt]

    def _decode(self, ids) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True) if self.tokenizer is not None else ""

    def _stop_reason(self, generated) -> str:
        if any(token in self.eos_ids for token in generated):
            return "eos"
        if len(generated) >= self.max_new_tokens:
            return "max_new_tokens"
        return ""

    def _truncate(self, generated):
        """Cut after the first EOS token and at max_new_tokens."""
        for index, token in enumerate(generated):
            if token in self.eos_ids:
                generated = generated[: index + 1]
                break
        return generated[: self.max_new_tokens]


class SpeculativeDecoder(TextDecoding):
    """Speculative decoding of ``target`` with ``draft`` and a registered verification rule.

    target: a transformers causal LM or an ``HFModelAdapter``.
    draft:  a transformers causal LM / adapter (neural draft), ``"ngram"`` (training-free
            prompt-lookup draft), any ``Drafter``, or None with method "ar" (plain sampling).
    method: a registry name (``verispec.verify.registry.METHODS``) or "ar".
    num_drafts (K), draft_len (L): K i.i.d. paths of length L, or a chain when K = 1.
    tree:   children per depth for token-tree methods (e.g. [2, 2, 1]); overrides L.
    temperature / top_k / top_p: applied to target and draft logits alike (0 = greedy);
    draft_temperature overrides the draft's temperature only.
    backend: how the adapters run a model forward (``models.hf``): "auto" (default: the native
    Llama forward when the model qualifies), "native" or "transformers" (the model's own forward).
    step_callback(tree, result, step): called after every speculative round with the verified
    ``DraftTree`` (target vectors as verified, modifications applied), the ``VerifyResult`` and
    the round's ``StepStats`` — e.g. to record draft trees for replay.
    """

    def __init__(
        self,
        target,
        draft=None,
        tokenizer=None,
        method: str = "sd",
        num_drafts: int = 1,
        draft_len: int = 4,
        tree: Sequence[int] | None = None,
        temperature: float = 1.0,
        top_k: int = 0,
        top_p: float = 1.0,
        draft_temperature: float | None = None,
        max_new_tokens: int = 128,
        eos_token_id: int | Sequence[int] | None = None,
        stop: Sequence[str] = (),
        seed: int = 0,
        device=None,
        step_callback=None,
        backend: str = "auto",
    ):
        self._set_up(target, tokenizer, temperature, top_k, top_p, draft_temperature, max_new_tokens,
                     eos_token_id, stop, seed, device, backend)
        self.method = method
        self.spec: MethodSpec | None = None if method == "ar" else get_method(method)
        self.step_callback = step_callback
        self.num_drafts, self.draft_len, self.tree = self._check_shape(num_drafts, draft_len, tree)
        self.drafter: Drafter | None = None if self.spec is None else self._make_drafter(draft, device)
        if self.drafter is not None and self.drafter.vocab_size != self.target.vocab_size:
            raise ConfigError(
                f"draft vocabulary has {self.drafter.vocab_size} tokens but the target has "
                f"{self.target.vocab_size}; speculative decoding needs one shared tokenizer/vocabulary"
            )

    # ----- configuration checks ----------------------------------------------------------
    def _check_shape(self, num_drafts, draft_len, tree):
        for name, value, limit in (("num_drafts (K)", num_drafts, MAX_DRAFTS), ("draft_len (L)", draft_len, MAX_DRAFT_LEN)):
            if int(value) != value or not 1 <= value <= limit:
                raise ConfigError(f"{name} must be an integer in [1, {limit}], got {value!r}")
        spec = self.spec
        if spec is None:
            return 1, 1, None
        if spec.name == "sprinter":
            raise ConfigError("method 'sprinter' needs a trained verifier: use SprinterDecoder / --verifier PATH")
        if tree is not None:
            tree = [int(width) for width in tree]
            if not tree or min(tree) < 1:
                raise ConfigError(f"tree must list >= 1 children per depth, got {tree}")
            if spec.tree_scheme is None:
                raise ConfigError(
                    f"method {spec.name!r} verifies {'one path' if spec.draft == 'chain' else 'K i.i.d. paths'}, "
                    "not token trees; drop --tree or use rrs, rrsw, traversal, nss or spechub"
                )
            if spec.tree_scheme is DraftScheme.SPECHUB_PAIR and max(tree) > 2:
                raise ConfigError(f"spechub trees have 1 or 2 children per node, got {tree}")
            return max(tree), len(tree), tree
        if spec.draft == "chain" and num_drafts != 1:
            raise ConfigError(
                f"method {spec.name!r} verifies a single draft path; use K = 1, or a multi-draft "
                "method (spectr, spectr-gbv-star, gmpbv, rrs, rrsw, traversal, nss)"
            )
        if spec.draft == "tree":  # spechub: a hub pair at the root, then single children
            if num_drafts != 2:
                raise ConfigError("spechub drafts hub pairs: use K = 2 (or give --tree, e.g. 2,2,1)")
            return 2, draft_len, [2] + [1] * (draft_len - 1)
        if spec.name == "otm":
            vocab = self.target.vocab_size
            if vocab**num_drafts > OTM_MAX_TUPLES:
                raise ConfigError(
                    f"otm solves a linear program over V^K = {vocab}^{num_drafts} draft tuples; it is an "
                    f"exponential reference for V^K <= {OTM_MAX_TUPLES} (toy vocabularies). Use spectr or rrsw."
                )
        return int(num_drafts), int(draft_len), None

    def _make_drafter(self, draft, device) -> Drafter:
        if draft is None or (isinstance(draft, str) and draft == "ngram"):
            return NGramDrafter(self.target.vocab_size, self.draft_params)
        if hasattr(draft, "begin_round"):
            return draft
        return ModelDrafter(_as_adapter(draft, device, self.backend), self.draft_params)

    # ----- one round ----------------------------------------------------------------------
    def _draft(self, rng, draft_fn) -> DraftSkeleton:
        spec = self.spec
        if self.tree is not None:
            return sample_tree(rng, draft_fn, self.tree, spec.tree_scheme)
        return sample_iid_paths(rng, draft_fn, self.num_drafts, self.draft_len)

    def _target_tree(self, skeleton: DraftSkeleton, windows):
        """Score the tree; its target rows stay logits on the model's device (core.rows.LogitRows)
        and are processed only where the rule reads them. Modification windows (GBV-mod,
        SpecTr-GBV★) rewrite whole rows, so with windows in force every row is built."""
        logits = self.target.score([-1, *skeleton.tokens[1:]], list(skeleton.parents))
        rows = LogitRows(logits, self.params)
        if not windows:
            return skeleton.with_target(rows, validate=False), None
        modified = modify_tree_targets(
            windows, np.asarray(skeleton.tokens), np.asarray(skeleton.parents), rows.dense(), skeleton.draft_probs
        )
        return skeleton.with_target(modified.target_probs, validate=False), modified

    # ----- the loop -------------------------------------------------------------------------
    def _run(self, prompt, rng=None) -> Iterator[GenerationOutput]:
        prompt_ids = self._encode(prompt)
        rng = SeededRng(self.seed) if rng is None else rng
        start = time.perf_counter()
        self.target.reset(prompt_ids)
        if self.drafter is not None:
            self.drafter.reset(prompt_ids)
        prefill_seconds = time.perf_counter() - start
        generated: list[int] = []
        steps: list[StepStats] = []
        windows: tuple = ()
        stop_reason = "max_new_tokens"
        while True:
            if len(prompt_ids) + len(generated) + self.draft_len + 1 >= self.target.max_context:
                stop_reason = "context"
                break
            step, output_tokens, windows = self._round(rng, windows) if self.spec else self._plain_round(rng)
            tic = time.perf_counter()
            generated.extend(output_tokens)
            stop_reason = self._stop_reason(generated)
            if stop_reason:
                generated = self._truncate(generated)
            text = self._decode(generated)
            if self.stop and any(s in text for s in self.stop):
                text = text[: min(text.index(s) for s in self.stop if s in text)]
                stop_reason = "stop_string"
            step.other_seconds += time.perf_counter() - tic
            steps.append(step)
            self.last_output = GenerationOutput(
                self.method, self.num_drafts, self.draft_len, prompt_ids, list(generated), text, steps,
                time.perf_counter() - start, prefill_seconds, stop_reason or "running", asdict(self.params),
            )
            yield self.last_output
            if stop_reason:
                return
        self.last_output = GenerationOutput(
            self.method, self.num_drafts, self.draft_len, prompt_ids, list(generated), self._decode(generated), steps,
            time.perf_counter() - start, prefill_seconds, stop_reason, asdict(self.params),
        )
        yield self.last_output

    def _plain_round(self, rng):
        tic = time.perf_counter()
        logits = self.target.score([-1], [-1])
        rows = LogitRows(logits, self.params)
        target_seconds = time.perf_counter() - tic
        tic = time.perf_counter()
        token, _ = draw_from(rng, rows, 0)  # greedy: the argmax, no vector built
        self.target.commit([], token)
        return StepStats(0, 1, 0, 1, 0.0, target_seconds, 0.0, time.perf_counter() - tic), [token], ()

    def _round(self, rng, windows):
        tic = time.perf_counter()
        calls_before = self.drafter.calls
        skeleton = self._draft(rng, self.drafter.begin_round())
        draft_seconds = time.perf_counter() - tic

        tic = time.perf_counter()
        tree, modified = self._target_tree(skeleton, windows)
        target_seconds = time.perf_counter() - tic

        tic = time.perf_counter()
        result = self.spec.verifier.verify(tree, rng)
        verify_seconds = time.perf_counter() - tic

        tic = time.perf_counter()
        path = tree.path_to(result.accepted_node)
        self.target.commit(path, result.next_token)
        self.drafter.commit(result.accepted_tokens, result.next_token)
        windows = self._next_windows(tree, modified, result)
        step = StepStats(
            accepted_len=result.accepted_len,
            new_tokens=result.accepted_len + 1,
            drafted_tokens=sum(len(p) for p in tree.paths) if tree.paths else tree.num_nodes - 1,
            tree_nodes=tree.num_nodes,
            draft_seconds=draft_seconds,
            target_seconds=target_seconds,
            verify_seconds=verify_seconds,
            other_seconds=time.perf_counter() - tic,
            draft_calls=self.drafter.calls - calls_before,
        )
        if self.step_callback is not None:
            self.step_callback(tree, result, step)
        return step, list(result.output_tokens), windows

    @staticmethod
    def _next_windows(tree: DraftTree, modified, result):
        """Windows in force at the next round's root: the old ones moved along the emitted
        tokens, plus the one this round left (oldest first)."""
        windows = ()
        if modified is not None:
            node = result.accepted_node
            windows = advance_windows(modified.windows[node], modified.bases[node], result.next_token, tree.draft.row(node))
        if result.modification is not None:
            windows = windows + (result.modification,)
        return windows
