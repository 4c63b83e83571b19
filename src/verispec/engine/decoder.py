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
from dataclasses import asdict, replace

import numpy as np

from verispec.core.noise import NoiseAt, SeededDraws, noise_of
from verispec.core.rows import LogitRows, draw_from
from verispec.core.sampling import SamplingParams, logits_to_probs
from verispec.core.seeds import check_seed
from verispec.core.tree import DraftScheme, DraftTree
from verispec.draft.chain_policy import ChainLengthPolicy
from verispec.draft.tree_policy import RestSchedule
from verispec.draft.samplers import DraftSkeleton, sample_gumbel_chain, sample_iid_paths, sample_tree
from verispec.engine.checks import (
    AUTO_MAX_DRAFT_LEN,
    DEFAULT_DRAFT_LEN,
    MAX_DRAFT_LEN,
    MAX_DRAFTS,
    OTM_MAX_TUPLES,
    check_max_new_tokens,
    check_prompt_ids,
    check_stop_strings,
    check_tree_shape,
    eos_token_ids,
)
from verispec.engine.adapters import _as_adapter, draft_backend  # noqa: F401 (imported from here by callers)
from verispec.engine.cost_model import OnlineCostModel, RoundDecision
from verispec.engine.drafters import Drafter, ModelDrafter, NGramDrafter, TokenTreeDrafter, default_method, is_token_tree, start_adjacency
from verispec.engine.results import GenerationOutput, StepStats
from verispec.engine.invariance import enable_batch_invariance, fit_rounds_to_rows, row_shape_of
from verispec.engine.head_drafter import CONTEXT_ONLY_Q_RULES, HeadDrafter, is_head_source, load_head_source
from verispec.engine.streaming import TextStream, stop_cut
from verispec.errors import ConfigError
from verispec.verify.modification import advance_windows, modify_tree_targets
from verispec.verify.qfree import qfree_walk
from verispec.verify.base import VerifyResult
from verispec.verify.gumbel import GumbelCoupledVerification
from verispec.verify.registry import MethodSpec, get_method


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
        self.max_new_tokens = check_max_new_tokens(max_new_tokens)
        self.stop = check_stop_strings(stop)
        self.eos_ids = eos_token_ids(eos_token_id, tokenizer, self.target)
        self.seed = check_seed(seed)
        self.last_output = None

    def generate(self, prompt: str | Sequence[int], rng=None) -> GenerationOutput:
        """Decode until max_new_tokens, an EOS token or a stop string. ``rng``: any ``Rng``
        (default ``SeededDraws(self.seed)``: the seed's Gumbel noise for the drafter-invariant
        draws, ``core.noise``), e.g. the replay enumerator for exact tests; a plain ``Rng``
        makes every rule draw through it (exact in law, not drafter-invariant)."""
        for _ in self._run(prompt, rng):
            pass
        return self.last_output

    def stream(self, prompt: str | Sequence[int], rng=None) -> Iterator[str]:
        """Yield text as blocks are accepted; the concatenation equals ``generate(prompt, rng).text``
        exactly. Only a tail that a later block could still change is held back (an unfinished
        UTF-8 character, trailing spaces, a possible start of a stop string): ``TextStream``."""
        text_stream = TextStream(self.stop)
        for output in self._run(prompt, rng):
            piece = text_stream.push(output.text, final=output.stop_reason != "running")
            if piece:
                yield piece

    def _run(self, prompt, rng=None) -> Iterator[GenerationOutput]:  # pragma: no cover - abstract
        raise NotImplementedError

    def _encode(self, prompt) -> list[int]:
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise ConfigError("a text prompt needs a tokenizer; pass tokenizer= or token ids")
            from verispec.models.default import encode_prompt

            return encode_prompt(self.tokenizer, prompt)
        return check_prompt_ids(prompt, self.target.vocab_size)

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
    draft:  a transformers causal LM / adapter (neural draft), ``"head"`` (the shipped EAGLE-3 draft
            head), a head directory or an ``Eagle3Head`` (``HeadDrafter``), ``"tree"`` (training-free
            target-aware token trees, ``TokenTreeDrafter``), ``"ngram"`` (stochastic
            prompt-lookup draft), any ``Drafter``, or None: the token trees when the method is
            left to its default or is a q-free rule, else the n-gram draft.
    method: a registry name (``verispec.verify.registry.METHODS``) or "ar"; None (default) picks
            "qfree" for the token-tree draft (the fastest training-free configuration) and
            "gumbel" (the drafter-invariant chain rule) for any other draft.
    seed:   an int in [0, 2**63). With the drafter-invariant rules (ar, qfree, nss, gumbel) the
            token at absolute position t is the Gumbel-max draw with the seed's noise at t, so a
            seed gives one text whatever the draft, tree, timing or threads (docs/drafter-invariance.md).
    num_drafts (K), draft_len (L): K i.i.d. paths of length L, or a chain when K = 1. draft_len
            None (default): for a chain of sampled drafts verified by a chain rule without target
            modification (gumbel, sd, bv, ...), L is chosen every round in [0, max_draft_len] from
            past acceptance and the online cost model (L = 0: a plain round); otherwise L = 4.
            An explicit L is used as given, every round.
    tree:   children per depth for token-tree methods (e.g. [2, 2, 1]); overrides L.
    temperature / top_k / top_p: applied to target and draft logits alike (0 = greedy);
    draft_temperature overrides the draft's temperature only.
    backend: how the adapters run a model forward (``models.hf``): "auto" (default: the native
    Llama forward when the model qualifies), "native" or "transformers" (the model's own forward),
    or "llamacpp" (a GGUF file through llama.cpp, ``models.llamacpp``: target and draft given as
    ``.gguf`` paths, or the default / "gemma3-270m" target's GGUF; a transformers draft model
    then still runs on torch).
    step_callback(tree, result, step): called after every speculative round with the verified
    ``DraftTree`` (target vectors as verified, modifications applied; the model's own rows in
    ``tree.unmodified_target`` when windows were in force), the ``VerifyResult`` and
    the round's ``StepStats`` — e.g. to record draft trees for replay.
    cost_model: the size policies' ``OnlineCostModel`` (default: a fresh one at the target's prior);
    decoders on one target may share one, since it describes the machine (the server's workers do).
    batch_invariant: shape every target forward with the row shape measured for this machine
    (``engine.invariance``), so rows do not depend on the forward they share and a seed gives plain
    sampling's text bit for bit in bf16 too; native runner, one sequence at a time.
    adjacency: the token-tree draft's starting ``AdjacencyTable`` (copied: the decoder learns in its
    own copy), or the path of one written by ``AdjacencyTable.save``; None: an empty table. Drafts
    only: the text is the same with any table (docs/adaptive-speculation.md: what it is worth).
    """

    def __init__(
        self,
        target,
        draft=None,
        tokenizer=None,
        method: str | None = None,
        num_drafts: int = 1,
        draft_len: int | None = None,
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
        max_draft_len: int = AUTO_MAX_DRAFT_LEN,
        cost_model: OnlineCostModel | None = None,
        batch_invariant: bool = False,
        adjacency=None,
    ):
        self._set_up(target, tokenizer, temperature, top_k, top_p, draft_temperature, max_new_tokens,
                     eos_token_id, stop, seed, device, backend)
        self.row_shape = enable_batch_invariance(self.target) if batch_invariant else row_shape_of(self.target)
        if method is None:
            method = default_method(draft)
        self.method = method
        self.spec: MethodSpec | None = None if method == "ar" else get_method(method)
        self.step_callback = step_callback
        # the round timings every size policy reads; persists across prompts (it describes the machine)
        # a backend whose forwards cost differently from the shipped prior curve says so (cost_prior)
        prior = getattr(self.target, "cost_prior", None)
        self.cost_model = OnlineCostModel(prior_points=prior) if cost_model is None else cost_model
        # generate_batch's: total tokens scored by one batched forward (all sequences) -> seconds
        self.batch_cost_model = OnlineCostModel(prior_points=prior)
        # set by a batch: chain gains -> (scored tokens, decision), instead of choosing L alone
        self.chain_planner = None
        self.adaptive_draft_len = draft_len is None and self._chain_len_adapts(tree)
        if draft_len is None:
            draft_len = max_draft_len if self.adaptive_draft_len else DEFAULT_DRAFT_LEN
        self.num_drafts, self.draft_len, self.tree = self._check_shape(num_drafts, draft_len, tree)
        self.drafter: Drafter | None = None if self.spec is None else self._make_drafter(draft, device)
        if getattr(self.drafter, "deterministic", False):
            if DraftScheme.DETERMINISTIC not in self.spec.verifier.supported_schemes:
                raise ConfigError(
                    f"method {self.spec.name!r} reads the draft's sampling law q, but token-tree candidates are "
                    "chosen deterministically (no q), so it would not be exact; use method 'qfree' (or 'nss'), "
                    "or a sampled draft such as draft='ngram' / --draft ngram"
                )
            if tree is not None:
                raise ConfigError("the token-tree draft sizes its trees itself; drop tree= / --tree")
            self.draft_len = self.drafter.max_depth
        elif self.drafter is not None and self.tree is None and self.spec.tree_scheme is DraftScheme.DETERMINISTIC:
            # said here rather than at the first round, so a sweep refuses the pair before decoding
            raise ConfigError(
                f"method {self.spec.name!r} with a sampled draft needs a tree shape (e.g. tree=[2, 2, 1] / --tree 2,2,1), "
                "or use the token-tree draft (draft='tree')"
            )
        if isinstance(self.drafter, HeadDrafter) and self.spec.name in CONTEXT_ONLY_Q_RULES:
            raise ConfigError(
                f"method {self.spec.name!r} modifies the target assuming the draft's q of a prefix depends on the "
                "tokens alone (ALGORITHMS.md §4.3, §6.3); a draft head's q changes once the prefix is committed "
                "(target features replace its own), which makes it lossy (tests/engine/test_head_drafter.py); "
                "use sd / bv (one path) or spectr / gmpbv / rrsw / traversal (several) with the head"
            )
        if self.drafter is not None and self.drafter.vocab_size != self.target.vocab_size:
            raise ConfigError(
                f"draft vocabulary has {self.drafter.vocab_size} tokens but the target has "
                f"{self.target.vocab_size}; speculative decoding needs one shared tokenizer/vocabulary"
            )
        if adjacency is not None:
            start_adjacency(self.drafter, adjacency, self.target.vocab_size)
        if self.row_shape is not None:
            fit_rounds_to_rows(self, self.row_shape)

    def generate_batch(self, prompts, max_batch: int = 8, **options) -> list:
        """Decode several prompts together, one target forward per round for all of them, at most
        ``max_batch`` at once; options and outputs as ``engine.batch.BatchDecoder.generate``."""
        from verispec.engine.batch import BatchDecoder

        if self.row_shape is not None:
            raise ConfigError("batch-invariant mode shapes single-sequence forwards; decode the prompts one by one")
        return BatchDecoder(self, max_batch=max_batch).generate(prompts, **options)

    # ----- configuration checks ----------------------------------------------------------
    def _chain_len_adapts(self, tree) -> bool:
        """Whether L is chosen per round: a sampled chain (no tree) verified by a chain rule that
        leaves no target modification (GBV-mod's windows need the full L, ALGORITHMS.md §4.3)."""
        spec = self.spec
        return (
            spec is not None and spec.draft == "chain" and spec.name != "sprinter" and tree is None
            and not spec.verifier.needs_target_modification
        )

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
            tree = check_tree_shape(tree)
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
        if spec.tree_scheme is DraftScheme.DETERMINISTIC:  # qfree: an adaptive token tree, or --tree
            return 1, draft_len, None
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
        if getattr(draft, "deterministic", False):
            return draft
        if is_token_tree(draft) and (draft is not None or self.spec.tree_scheme is DraftScheme.DETERMINISTIC):
            return TokenTreeDrafter(self.target.vocab_size, prior_scale=getattr(self.target, "acceptance_prior_scale", 1.0),
                                    rest=RestSchedule(getattr(self.target, "rest_after", 0), getattr(self.target, "rest_wake_every", 8)))
        if draft is None or (isinstance(draft, str) and draft == "ngram"):
            return NGramDrafter(self.target.vocab_size, self.draft_params)
        if hasattr(draft, "begin_round"):
            return draft
        if is_head_source(draft):  # "head", a head directory or an Eagle3Head: reads the target's features
            if not getattr(self.target, "features_supported", True):
                raise ConfigError(
                    f"a draft head reads the target's hidden states, which backend {self.target.backend!r} does not "
                    "return; use backend 'auto' (torch) with a head, or another draft (tree, ngram, a draft model)"
                )
            head = load_head_source(draft, self.target)
            return HeadDrafter(head, self.target, self.draft_params)
        return ModelDrafter(_as_adapter(draft, device, draft_backend(self.backend, draft)), self.draft_params)

    # ----- one round ----------------------------------------------------------------------
    def _fitting_shape(self, length: int, windows) -> tuple[int, list[int] | None] | None:
        """(draft length, tree) for a round starting after ``length`` tokens (prompt + generated):
        L and the tree depth shrink so that every node fits the target's context and every drafted
        prefix the draft's. None: nothing fits (or a target modification is in force, which needs
        the full L, ALGORITHMS.md §4.3) and decoding stops cleanly with stop_reason "context"."""
        if length >= self.target.max_context:
            return None
        if self.spec is None:
            return 1, None
        # target: the deepest node (depth L) sits at position length - 1 + L
        fits = self.target.max_context - length
        draft_context = getattr(getattr(self.drafter, "adapter", None), "max_context", None)
        if draft_context is not None:  # the draft scores prefixes up to depth L - 1
            fits = min(fits, draft_context - length + 1)
        draft_len = min(self.draft_len, fits)
        if draft_len < 1 or (draft_len < self.draft_len and windows):
            return None
        return draft_len, None if self.tree is None else self.tree[:draft_len]

    def _draft(self, rng, draft_fn, draft_len: int, tree: list[int] | None) -> DraftSkeleton:
        """Sample this round's draft: ``tree`` (children per depth) when given, else ``num_drafts``
        i.i.d. paths of ``draft_len`` tokens; both as ``_fitting_shape`` cut them for the round."""
        spec = self.spec
        if tree is None and spec.tree_scheme is DraftScheme.DETERMINISTIC:
            raise ConfigError(
                f"method {spec.name!r} with a sampled draft needs a tree shape (e.g. tree=[2, 2, 1] / --tree 2,2,1), "
                "or use the token-tree draft (draft='tree')"
            )
        if tree is not None:
            return sample_tree(rng, draft_fn, tree, spec.tree_scheme)
        draws = self._draws(rng)
        if isinstance(spec.verifier, GumbelCoupledVerification) and isinstance(draws, NoiseAt):
            return sample_gumbel_chain(draws, draft_fn, draft_len, self.target.vocab_size)
        return sample_iid_paths(rng, draft_fn, self.num_drafts, draft_len)

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
        tree = replace(skeleton.with_target(modified.target_probs, validate=False), unmodified_target=rows)
        return tree, modified

    # ----- the loop -------------------------------------------------------------------------
    def _run(self, prompt, rng=None) -> Iterator[GenerationOutput]:
        prompt_ids = self._encode(prompt)
        rng = SeededDraws(self.seed) if rng is None else rng
        start = time.perf_counter()
        # features (a draft head's input) only while this decoder's drafter reads them: the target
        # adapter may be shared with other decoders
        feature_layers = getattr(self.drafter, "feature_layers", None)
        if feature_layers is not None:
            self.target.enable_features(feature_layers)
        elif getattr(self.target, "feature_layers", None) is not None:
            self.target.disable_features()
        self.target.reset(prompt_ids)
        if self.drafter is not None:
            self.drafter.reset(prompt_ids)
        # acceptance is learned per prompt: a policy state shared across prompts would make a
        # prompt's output depend on the earlier ones (and break the exact-law replays)
        chain_policy = ChainLengthPolicy(self.draft_len) if self.adaptive_draft_len else None
        prefill_seconds = time.perf_counter() - start
        generated: list[int] = []
        steps: list[StepStats] = []
        windows: tuple = ()
        stop_reason = "max_new_tokens"
        while True:
            shape = self._fitting_shape(len(prompt_ids) + len(generated), windows)
            if shape is None:
                stop_reason = "context"
                break
            draft_len, tree = shape
            decision = None
            if chain_policy is not None:
                draft_len, decision = self._choose_chain_len(chain_policy, draft_len)
            if self.spec is None:
                step, output_tokens, windows = self._plain_round(rng)
            elif getattr(self.drafter, "deterministic", False) and getattr(self.drafter, "resting", bool)():  # without resting(): never rests
                step, output_tokens, windows = self._plain_round(rng)  # the root-only walk's own draw
                self.drafter.commit([], output_tokens[0])
                decision = RoundDecision(1, 1.0, self.cost_model.standing_seconds(1))
            elif getattr(self.drafter, "deterministic", False):
                step, output_tokens = self._token_tree_round(rng, len(prompt_ids) + len(generated))
                decision = step.policy
            elif draft_len == 0:  # the policy found no L worth its cost: a plain round, drafter kept in sync
                step, output_tokens, windows = self._plain_round(rng)
                self.drafter.commit([], output_tokens[0])
            else:
                step, output_tokens, windows = self._round(rng, windows, draft_len, tree)
            tic = time.perf_counter()
            generated.extend(output_tokens)
            stop_reason = self._stop_reason(generated)
            if stop_reason:
                generated = self._truncate(generated)
            text, stopped = stop_cut(self._decode(generated), self.stop)
            if stopped:
                stop_reason = "stop_string"
            step.other_seconds += time.perf_counter() - tic
            self._learn(step, decision, chain_policy, draft_len)
            steps.append(step)
            self.last_output = GenerationOutput(
                self.method, self.num_drafts, self.draft_len, prompt_ids, list(generated), text, steps,
                time.perf_counter() - start, prefill_seconds, stop_reason or "running", asdict(self.params),
            )
            yield self.last_output
            if stop_reason:
                return
        self.last_output = GenerationOutput(
            self.method, self.num_drafts, self.draft_len, prompt_ids, list(generated), stop_cut(self._decode(generated), self.stop)[0], steps,
            time.perf_counter() - start, prefill_seconds, stop_reason, asdict(self.params),
        )
        yield self.last_output

    def _choose_chain_len(self, chain_policy: ChainLengthPolicy, fitting: int) -> tuple[int, RoundDecision]:
        """This round's L (at most ``fitting``, what the contexts allow) and its record; in a batch
        (``chain_planner`` set by engine.batch) the batch budget chooses it with the other sequences."""
        if self.chain_planner is not None:
            gains = chain_policy.gains(fitting)
            nodes, plan = self.chain_planner(gains)
            choice = chain_policy.settle(nodes - 1, gains)
            return choice.draft_len, RoundDecision(choice.draft_len + 1, choice.expected_tokens, plan.predicted_seconds,
                                                   choice.probe, choice.draft_len, batch=plan)
        choice = chain_policy.choose(self.cost_model, fitting)
        predicted = self.cost_model.round_seconds(choice.draft_len + 1)
        return choice.draft_len, RoundDecision(choice.draft_len + 1, choice.expected_tokens, predicted, choice.probe, choice.draft_len)

    def _learn(self, step: StepStats, decision: RoundDecision | None, chain_policy, draft_len: int) -> None:
        """Feed the round's timings to the cost model and its outcome to the chain policy; complete
        the decision's record with what the round measured."""
        if self.spec is None:
            return
        overhead = step.draft_seconds + step.verify_seconds + step.other_seconds
        self.cost_model.record(step.tree_nodes, step.target_seconds, overhead)
        if chain_policy is not None:
            chain_policy.record(draft_len, step.accepted_len)
        if decision is not None:
            decision.measured_target_seconds = step.target_seconds
            decision.measured_round_seconds = step.target_seconds + overhead
            step.policy = decision

    def _draws(self, rng):
        """This round's randomness for the target's draws: the seed's noise positioned at the
        root's next token when the rng carries it and the rule is drafter-invariant (or plain
        sampling), else the rng itself."""
        noise = noise_of(rng)
        if noise is None or (self.spec is not None and not self.spec.drafter_invariant):
            return rng
        return NoiseAt(noise, self.target.committed_len + 1)

    def _plain_round(self, rng):
        tic = time.perf_counter()
        logits = self.target.score([-1], [-1])
        rows = LogitRows(logits, self.params)
        target_seconds = time.perf_counter() - tic
        tic = time.perf_counter()
        draws = self._draws(rng)  # greedy: the argmax, no vector built
        token = draws.draw(rows, 0, 0) if isinstance(draws, NoiseAt) else draw_from(rng, rows, 0)[0]
        self.target.commit([], token)
        return StepStats(0, 1, 0, 1, 0.0, target_seconds, 0.0, time.perf_counter() - tic), [token], ()

    def _round(self, rng, windows, draft_len: int, tree: list[int] | None):
        """One speculative round with this round's shape (``_fitting_shape``): draft, score, verify,
        commit. Returns (StepStats, emitted tokens, windows in force at the next root)."""
        tic = time.perf_counter()
        calls_before = self.drafter.calls
        skeleton = self._draft(rng, self.drafter.begin_round(), draft_len, tree)
        draft_seconds = time.perf_counter() - tic

        tic = time.perf_counter()
        tree, modified = self._target_tree(skeleton, windows)
        target_seconds = time.perf_counter() - tic

        tic = time.perf_counter()
        result = self.spec.verifier.verify(tree, self._draws(rng))
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

    def _token_tree_round(self, rng, length: int):
        """One round with a deterministic candidate tree (``TokenTreeDrafter``): one target
        forward over the tree, the drafter sees the logits of every scored node, and the q-free
        walk (``verify.qfree``) turns into probabilities only the rows of the nodes it visits
        (``core.rows.LogitRows``)."""
        tic = time.perf_counter()
        # the deepest node sits at position length - 1 + depth: keep it inside the target's context
        rate = getattr(self.drafter, "rate", None)  # read before the round's commit updates it
        time_price = None if rate is None else rate.value
        candidates = self.drafter.propose(max_depth=self.target.max_context - length, cost=self.cost_model)
        plan = candidates.plan  # in a batch: the batch budget chose the size, for the batched forward's cost
        predicted = self.cost_model.round_seconds(candidates.num_nodes) if plan is None else plan.predicted_seconds
        decision = RoundDecision(candidates.num_nodes, candidates.expected_tokens, predicted, candidates.probe, batch=plan,
                                 time_price=time_price if plan is None else None)
        draft_seconds = time.perf_counter() - tic

        tic = time.perf_counter()
        logits = self.target.score([-1, *candidates.tokens[1:]], list(candidates.parents))
        target_seconds = time.perf_counter() - tic

        tic = time.perf_counter()
        self.drafter.observe_target(candidates.tokens, candidates.parents, logits)
        rows = LogitRows(logits, self.params)  # a row is processed only when the walk visits its node
        children = candidates.children_of()
        visited, next_token, is_bonus, _ = qfree_walk(children.__getitem__, rows, self._draws(rng))
        verify_seconds = time.perf_counter() - tic

        tic = time.perf_counter()
        path = visited[1:]
        accepted = [candidates.tokens[node] for node in path]
        self.target.commit(path, next_token)
        self.drafter.observe_walk(candidates, visited)
        self.drafter.commit(accepted, next_token)
        step = StepStats(
            accepted_len=len(accepted),
            new_tokens=len(accepted) + 1,
            drafted_tokens=candidates.num_nodes - 1,
            tree_nodes=candidates.num_nodes,
            draft_seconds=draft_seconds,
            target_seconds=target_seconds,
            verify_seconds=verify_seconds,
            other_seconds=time.perf_counter() - tic,
            policy=decision,
        )
        if self.step_callback is not None:
            tree = DraftTree.build(
                candidates.tokens, candidates.parents, logits_to_probs(logits, self.params),
                np.zeros((candidates.num_nodes, self.target.vocab_size)), DraftScheme.DETERMINISTIC, validate=False,
            )
            self.step_callback(tree, VerifyResult(path[-1] if path else 0, tuple(accepted), int(next_token), is_bonus), step)
        return step, [*accepted, int(next_token)]

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

