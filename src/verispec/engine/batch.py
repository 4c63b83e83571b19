"""Batched speculative decoding: B sequences, one target forward per round (DESIGN.md §4).

``BatchDecoder(decoder).generate(prompts, ...)`` (or ``SpeculativeDecoder.generate_batch``) decodes
several prompts together. Each sequence is decoded by its OWN ``SpeculativeDecoder``: its own rule
state, ``Rng`` (seed), sampling parameters, stop condition, modification windows and drafter, and a
target adapter (``HFModelAdapter``) whose runner is one slot of a shared
``models.batch_runner.BatchedLlamaRunner``. The only thing the sequences share is the target
forward: when a sequence's adapter calls its runner, the request is queued and the sequence
pauses; once every sequence of the batch has queued its request (or finished), one forward runs
for all of them and each resumes with its own logits.

Why per-sequence decoders driven in turn rather than a second, batched copy of the round loop:
the rounds (plain, sampled drafts with every rule, token trees + q-free), the context limit, the
stop conditions and the stats are the single-sequence engine's own code, so a sequence in a batch
runs exactly the code it runs alone and changes to that loop apply to both. The sequences run as
threads that hand a single turn to each other in a fixed order (sequence 0, 1, ..., then the
forward), so only one runs at a time and the run is deterministic: a seed gives the same text
on every run. Threads are only the mechanism to pause a sequence inside its adapter's forward.

Per sequence, a decoded sequence's law equals its law decoded alone (each rule is exact for any
draft chosen from past information, and the batched forward computes each row's own function:
exactly in float64, to float rounding in fp32; tests/engine/test_batch_engine.py). Sequences
join and leave: at most ``max_batch`` decode at once, the others wait and join as sequences
finish. A batch of one sequence (one prompt, or ``max_batch`` 1) without a budget runs the
single-sequence path itself (the decoder's own adapter and runner, no threads): it costs what
``generate`` costs. A sequence whose input is bad (empty prompt, ids outside the vocabulary, a prompt longer
than the context) ends with stop_reason "error" and its message; the others still finish. A
sequence reaching the context limit stops with "context" as it would alone.

Drafts: the token trees (each sequence its own copy of the decoder's drafter, sharing its
adjacency table and acceptance estimates) and the n-gram draft batch; draft models and heads do not yet
(ConfigError). Timing: a sequence's ``seconds`` is the batch's wall time until it finished, and
each step's ``target_seconds`` the wall time its forward took including the turns of the other
sequences of that round.

Per-round budget (``engine.batch_budget``): by default the batch's own cost model for the batched
forward (``SpeculativeDecoder.batch_cost_model``: total scored tokens -> seconds) decides how many
tree nodes each sequence drafts: every sequence offers its best-first candidates, and the batch
keeps the global prefix with the most expected tokens per predicted second
(``split_scored_tokens``); the decision goes into each step's ``policy.batch``. This takes one more
turn per sequence and round: a sequence pauses once with its offer, once at its forward.
``budget`` (a ``BudgetPolicy``, e.g. ``EvenSplit``) instead caps each sequence's tree and lets
its drafter size it alone.
"""

from __future__ import annotations

import copy
import dataclasses
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from verispec.core.rng import Rng
from verispec.engine.batch_budget import (  # noqa: F401  (re-exported: the batch's budget API)
    BatchRoundDecision,
    BudgetPolicy,
    EvenSplit,
    SequenceView,
    drafter_choice,
    split_scored_tokens,
)
from verispec.engine.checks import check_max_new_tokens, check_stop_strings
from verispec.engine.cost_model import OnlineCostModel
from verispec.engine.results import GenerationOutput
from verispec.engine.drafters import NGramDrafter, TokenTreeDrafter
from verispec.errors import ConfigError
from verispec.models.batch_runner import BatchedLlamaRunner, SlotRunner
from verispec.models.hf import HFModelAdapter
from verispec.models.token_tree import SuffixIndex


@dataclass
class BatchGenerationOutput(GenerationOutput):
    """``GenerationOutput`` of one sequence of a batch; ``error`` holds the message of a sequence
    that could not be decoded (stop_reason "error"), None otherwise."""

    error: str | None = None

    def to_dict(self) -> dict:
        return {**super().to_dict(), "error": self.error}


@dataclass
class _Sequence:
    """One sequence of the batch: its decoder, its thread and the turn handed to it."""

    index: int
    prompt: object
    decoder: Any = None  # this sequence's own SpeculativeDecoder
    rng: Rng | None = None
    slot: SlotRunner | None = None
    thread: threading.Thread | None = None
    turn: threading.Semaphore = field(default_factory=lambda: threading.Semaphore(0))
    done: bool = False
    output: GenerationOutput | None = None
    error: str | None = None
    exception: BaseException | None = None
    max_nodes: int | None = None  # the token-tree drafter's own limit, restored after a budgeted round
    offer: Any = None  # its candidates' expected tokens, best first, while it waits for the budget's decision
    share: tuple[int, BatchRoundDecision] | None = None  # the budget's answer: (tree nodes, decision)


class _Aborted(Exception):
    """Raised inside a paused sequence when the batch stops because of an unexpected error."""


def _per_sequence(values, count: int, name: str) -> list:
    """``values`` as a list of ``count`` (one value for all, or one per prompt)."""
    if values is None or isinstance(values, (int, float, str)) or not isinstance(values, Sequence):
        return [values] * count
    values = list(values)
    if len(values) != count:
        raise ConfigError(f"{name} has {len(values)} entries for {count} prompts; give one per prompt or a single value")
    return values


def token_tree_copy(drafter: TokenTreeDrafter) -> TokenTreeDrafter:
    """A token-tree drafter with its own context index, plain-round streak and round state that
    shares ``drafter``'s adjacency table and acceptance estimates: they describe the target and
    learn from every sequence of a batch, one sequence at a time, as ``generate`` learns from every
    prompt."""
    own = copy.copy(drafter)
    own.index = SuffixIndex(drafter.index.max_match, drafter.index.max_scan)
    own.probes = dataclasses.replace(drafter.probes, plain_streak=0)
    own._rates = {}
    own._shadow = ()
    return own


class BatchDecoder:
    """Decodes batches of prompts with the settings of ``decoder`` (a ``SpeculativeDecoder`` whose
    target runs on the native Llama runner). Holds the slotted KV cache between calls."""

    def __init__(self, decoder, max_batch: int = 8):
        if isinstance(max_batch, bool) or int(max_batch) != max_batch or max_batch < 1:
            raise ConfigError(f"max_batch must be an integer >= 1, got {max_batch!r}")
        drafter = decoder.drafter
        if drafter is not None and not isinstance(drafter, (TokenTreeDrafter, NGramDrafter)):
            raise ConfigError(
                f"batched decoding drafts with the token trees or the n-gram draft; the {type(drafter).__name__} "
                f"draft (a draft model or head) cannot batch yet: use draft='tree' or draft='ngram', or decode one "
                "prompt at a time with generate"
            )
        if getattr(decoder.target, "backend", None) == "llamacpp":
            raise ConfigError("batched decoding is not built for the llamacpp backend yet: decode one prompt at a time "
                              "with generate, or batch on torch (backend 'auto' or 'native' with a Llama model)")
        if decoder.step_callback is not None:
            raise ConfigError("step_callback is not supported in batched decoding (it cannot tell the sequences apart); "
                              "use generate per prompt to record rounds")
        self.decoder = decoder
        self.max_batch = int(max_batch)
        # checked here, allocated at the first batch with as many slots as it runs at once
        self._base_runner = decoder.target.runner
        BatchedLlamaRunner.check_base(self._base_runner)
        self.runner: BatchedLlamaRunner | None = None
        self._lock = threading.Semaphore(0)  # the scheduler's turn
        self._aborted = False

    # ----- per-sequence decoders ------------------------------------------------------------
    def _drafter(self):
        """The sequence's own drafter: a token-tree drafter with its own context index
        (``token_tree_copy``: adjacency table and acceptance estimates shared, updated in the
        batch's fixed turn order, so runs stay deterministic); the n-gram draft; or none (plain)."""
        drafter = self.decoder.drafter
        if isinstance(drafter, TokenTreeDrafter):
            return token_tree_copy(drafter)
        return None if drafter is None else "ngram"

    def _sequence_decoder(self, adapter, seed, max_new_tokens, temperature, stop, cost_model=None):
        """The decoder of one sequence: the parent's settings with this sequence's own, on ``adapter``."""
        parent = self.decoder
        params, draft_params = parent.params, parent.draft_params
        # the parent's own class (not imported: engine.decoder imports this module for generate_batch)
        decoder = type(parent)(
            adapter,
            self._drafter(),
            tokenizer=parent.tokenizer,
            method=parent.method,
            num_drafts=parent.num_drafts,
            # an adaptive chain stays adaptive (its L chosen per round, by the batch budget when planned)
            draft_len=None if parent.adaptive_draft_len else parent.draft_len,
            max_draft_len=parent.draft_len,
            tree=parent.tree,
            temperature=params.temperature if temperature is None else temperature,
            top_k=params.top_k,
            top_p=params.top_p,
            draft_temperature=None if draft_params.temperature == params.temperature else draft_params.temperature,
            max_new_tokens=parent.max_new_tokens if max_new_tokens is None else max_new_tokens,
            eos_token_id=sorted(parent.eos_ids),
            stop=parent.stop if stop is None else stop,
            seed=parent.seed if seed is None else seed,
            cost_model=cost_model,
        )
        decoder.spec = parent.spec  # the parent's rule object itself (it may be set directly, e.g. a control)
        if isinstance(parent.drafter, NGramDrafter):
            decoder.drafter.model.max_n = parent.drafter.model.max_n
        return decoder

    # ----- turns ---------------------------------------------------------------------------
    def _pause(self, seq: _Sequence) -> None:
        """Called in ``seq``'s thread once its forward is queued: hand the turn back, wait for the next."""
        self._lock.release()
        seq.turn.acquire()
        if self._aborted:
            raise _Aborted

    def _offer(self, seq: _Sequence, offered) -> tuple[int, BatchRoundDecision]:
        """A sequence's planner (in its thread): hand its offer (the expected tokens of its candidate
        nodes, best first) to the scheduler, wait for its share (nodes to score, root included)."""
        seq.offer = offered
        self._pause(seq)
        share, seq.share = seq.share, None
        return share

    def _run_sequence(self, seq: _Sequence) -> None:
        seq.turn.acquire()
        try:
            if not self._aborted:
                seq.output = seq.decoder.generate(seq.prompt, rng=seq.rng)
        except ConfigError as error:
            seq.error = str(error)
        except _Aborted:
            pass
        except BaseException as error:  # re-raised by the scheduler
            seq.exception = error
        finally:
            seq.done = True
            self._lock.release()

    def _give_turn(self, seq: _Sequence) -> None:
        seq.turn.release()
        self._lock.acquire()

    def _start(self, seq: _Sequence, settings, planned: bool) -> None:
        seq.slot = self.runner.open(wait=lambda: self._pause(seq))
        try:
            seq.decoder = self._sequence_decoder(HFModelAdapter(self.decoder.target.model, runner=seq.slot), *settings)
        except ConfigError as error:
            seq.error, seq.done = str(error), True
            return
        if planned:
            self._plan_by_budget(seq)
        seq.thread = threading.Thread(target=self._run_sequence, args=(seq,), daemon=True, name=f"verispec-batch-{seq.index}")
        seq.thread.start()

    def _plan_by_budget(self, seq: _Sequence) -> None:
        """Let the batch budget size ``seq``'s rounds: its token trees or adaptive chain offer their
        candidates to the scheduler (``_offer``) instead of choosing alone. Its own cost model is
        frozen: its timings would time the whole batched round, whose cost the batch's model learns."""
        seq.decoder.cost_model = OnlineCostModel(learn=False)
        if isinstance(seq.decoder.drafter, TokenTreeDrafter):
            seq.decoder.drafter.planner = lambda offered: self._offer(seq, offered.scores[1:])
        elif seq.decoder.adaptive_draft_len:
            seq.decoder.chain_planner = lambda gains: self._offer(seq, gains)

    def _finish(self, seq: _Sequence) -> None:
        if seq.thread is not None:
            seq.thread.join()
        self.runner.close(seq.slot)

    # ----- the loop ------------------------------------------------------------------------
    def generate(
        self,
        prompts: Sequence,
        seeds=None,
        max_new_tokens=None,
        temperatures=None,
        stops=None,
        rngs: Sequence[Rng] | None = None,
        budget: BudgetPolicy | None = None,
    ) -> list[BatchGenerationOutput]:
        """Decode every prompt (text or token ids); one output per prompt, in order.

        seeds / max_new_tokens / temperatures / stops: one value for all or one per prompt (None:
        the decoder's). A sequence with the decoder's seed gives what ``generate`` gives for its
        prompt alone (greedy: the same tokens up to float rounding; sampled: the same law, and the
        same text where the draft does not depend on other sequences, e.g. the n-gram draft).
        rngs: one ``Rng`` per prompt instead of seeds (e.g. the replay enumerator in exact tests).
        budget: None (default): the batch budget splits each forward's tokens by expected tokens per
        predicted second (``engine.batch_budget``); or a ``BudgetPolicy`` capping each sequence's
        tree, sized by its own drafter (``EvenSplit``, ``drafter_choice``).
        """
        if isinstance(prompts, str):
            raise ConfigError(f"prompts must be a list of prompts, got the string {prompts!r}; write [{prompts!r}]")
        prompts = list(prompts)
        if not prompts:
            raise ConfigError("generate_batch needs at least one prompt")
        count = len(prompts)
        seeds = _per_sequence(seeds, count, "seeds")
        limits = [None if m is None else check_max_new_tokens(m) for m in _per_sequence(max_new_tokens, count, "max_new_tokens")]
        temperatures = _per_sequence(temperatures, count, "temperatures")
        if stops is None or isinstance(stops, str) or all(isinstance(s, str) for s in stops):
            stops = [None if stops is None else check_stop_strings(stops)] * count  # one list for every prompt
        else:
            stops = [None if s is None else check_stop_strings(s) for s in _per_sequence(stops, count, "stops")]
        rngs = _per_sequence(rngs, count, "rngs")
        if budget is not None and not isinstance(self.decoder.drafter, TokenTreeDrafter):
            raise ConfigError("a per-round budget applies to the token-tree draft only for now; drop budget=")
        settings = list(zip(seeds, limits, temperatures, stops))
        if budget is None and (count == 1 or self.max_batch == 1):
            return [self._decode_alone(prompt, rng, setting) for prompt, rng, setting in zip(prompts, rngs, settings)]
        planned = budget is None
        if self.runner is None:  # KV buffers of max_batch slots would be zero-filled for nothing when fewer run
            self.runner = BatchedLlamaRunner(self._base_runner, initial_slots=min(self.max_batch, count))
        self._aborted = False
        sequences = [_Sequence(i, prompt, rng=rngs[i]) for i, prompt in enumerate(prompts)]
        waiting = list(sequences)
        running: list[_Sequence] = []
        start = round_start = time.perf_counter()
        try:
            while waiting or running:
                while waiting and len(running) < self.max_batch:
                    seq = waiting.pop(0)
                    self._start(seq, settings[seq.index], planned)
                    running.append(seq)
                if not planned:
                    self._apply_budget(budget, running)
                for seq in running:  # each runs to its offer (planned trees) or its forward
                    if not seq.done:
                        self._give_turn(seq)
                self._raise_failure(running)
                plan = self._plan_round(running) if planned else None
                self._raise_failure(running)
                for seq in [s for s in running if s.done]:
                    self._finish(seq)
                    running.remove(seq)
                round_start = self._flush(plan, round_start)
        except BaseException:
            self._abort(running)
            raise
        seconds = time.perf_counter() - start
        return [self._output(seq, seconds) for seq in sequences]

    @staticmethod
    def _raise_failure(running: list[_Sequence]) -> None:
        for seq in running:
            if seq.exception is not None:
                raise seq.exception

    def _plan_round(self, running: list[_Sequence]) -> BatchRoundDecision | None:
        """Split this round's forward between the sequences waiting with an offer, then let each
        draft its share up to its forward. Tokens already queued (a joining sequence's prompt)
        count in the forward's cost."""
        offering = [s for s in running if not s.done and s.offer is not None]
        if not offering:
            return None
        offers = [seq.offer for seq in offering]
        plan = split_scored_tokens(offers, self.decoder.batch_cost_model, self.runner.pending_tokens)
        for seq, nodes in zip(offering, plan.nodes):
            seq.offer, seq.share = None, (nodes, plan)
            self._give_turn(seq)
        return plan

    def _flush(self, plan: BatchRoundDecision | None, round_start: float) -> float:
        """Run the batched forward; a planned round's timings go to its decision and to the batch
        cost model (the forward over all queued tokens; the rest of the round as overhead).
        Returns the end of the round."""
        scored = self.runner.pending_tokens
        tic = time.perf_counter()
        self.runner.flush()
        end = time.perf_counter()
        if plan is not None and scored:
            plan.measured_target_seconds, plan.measured_round_seconds = end - tic, end - round_start
            self.decoder.batch_cost_model.record(scored, end - tic, tic - round_start)
        return end

    def _decode_alone(self, prompt, rng, setting) -> BatchGenerationOutput:
        """One sequence at a time: the single-sequence path itself (the decoder's own target
        adapter and runner), so a batch of one costs what ``generate`` costs."""
        seq = _Sequence(0, prompt, rng=rng)
        start = time.perf_counter()
        try:
            # the parent's cost model too: alone, its timings are the round's own, as in generate
            seq.decoder = self._sequence_decoder(self.decoder.target, *setting, cost_model=self.decoder.cost_model)
            seq.output = seq.decoder.generate(prompt, rng=rng)
        except ConfigError as error:
            seq.error = str(error)
        return self._output(seq, time.perf_counter() - start)

    def _apply_budget(self, budget: BudgetPolicy, running: list[_Sequence]) -> None:
        live = [s for s in running if not s.done and s.decoder is not None and s.decoder.drafter is not None]
        if not live or not isinstance(live[0].decoder.drafter, TokenTreeDrafter):
            return
        views = []
        for seq in live:
            output = seq.decoder.last_output
            views.append(SequenceView(seq.index, len(seq.decoder.target.tokens()), 0 if output is None else output.new_tokens))
        limits = list(budget(views))
        if len(limits) != len(live):
            raise ConfigError(f"the budget policy returned {len(limits)} limits for {len(live)} sequences")
        for seq, limit in zip(live, limits):
            drafter = seq.decoder.drafter
            if seq.max_nodes is None:
                seq.max_nodes = drafter.max_nodes
            if limit is not None and (isinstance(limit, bool) or int(limit) != limit or limit < 0):
                raise ConfigError(f"the budget policy gave {limit!r} tree nodes; give an integer >= 0 or None")
            drafter.max_nodes = seq.max_nodes if limit is None else min(int(limit), seq.max_nodes)

    def _abort(self, running: list[_Sequence]) -> None:
        """Stop every paused sequence (they raise ``_Aborted`` in their thread) and free the slots."""
        self._aborted = True
        self.runner.discard_queued()
        for seq in running:
            if not seq.done and seq.thread is not None:
                seq.turn.release()
                seq.thread.join()
            self.runner.close(seq.slot)

    def _output(self, seq: _Sequence, seconds: float) -> BatchGenerationOutput:
        decoder = self.decoder
        if seq.output is not None:
            values = {f.name: getattr(seq.output, f.name) for f in fields(seq.output)}
            return BatchGenerationOutput(**values)
        settings = seq.decoder or decoder
        return BatchGenerationOutput(
            settings.method, settings.num_drafts, settings.draft_len, [], [], "", [], seconds, 0.0, "error",
            {}, error=seq.error,
        )
