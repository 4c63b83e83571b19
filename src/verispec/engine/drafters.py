"""Drafters: the bridge between a draft model and the samplers of ``verispec.draft``.

Each round a drafter hands the sampler a ``draft_fn`` (q(.|context, prefix) for one prefix, or
``batch_probs`` for a whole tree level in one model call); after verification ``commit`` tells it
which tokens were kept, so a KV-cached draft rolls back the rest.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from dataclasses import replace
from os import PathLike
from typing import Protocol

import numpy as np

from verispec.core.sampling import SamplingParams, logits_to_probs, process_probs
from verispec.draft.tree_policy import (
    ACCEPT_PRIOR, SIBLING_RANKS, AcceptanceEstimates, BestFirstOrder, Candidate, CandidateTree, CostTable, ProbeSchedule, RestSchedule, adjacency_bucket,
    LongRunRate, copy_bucket, grow_tree, root_alone_wins,
)
from verispec.errors import ConfigError
from verispec.models.token_tree import AdjacencyTable, SuffixIndex
from verispec.models.ngram import NGramDraft


class DraftFn(Protocol):
    def __call__(self, prefix: tuple[int, ...]) -> np.ndarray: ...

    def batch_probs(self, prefixes: Sequence[tuple[int, ...]]) -> list[np.ndarray]: ...


class Drafter(Protocol):
    vocab_size: int
    calls: int  # draft model forward calls so far

    def reset(self, prompt_ids: Sequence[int]) -> None: ...

    def begin_round(self) -> DraftFn: ...

    def commit(self, accepted: Sequence[int], next_token: int) -> None: ...


class _RoundFn:
    """Per-round cache prefix -> q row, filled by the drafter's batch scorer."""

    def __init__(self, score_batch):
        self.rows: dict[tuple[int, ...], np.ndarray] = {}
        self._score_batch = score_batch

    def batch_probs(self, prefixes):
        missing = [p for p in dict.fromkeys(map(tuple, prefixes)) if p not in self.rows]
        if missing:
            self.rows.update(zip(missing, self._score_batch(missing)))
        return [self.rows[tuple(p)] for p in prefixes]

    def __call__(self, prefix):
        return self.batch_probs([prefix])[0]


class NGramDrafter:
    """The training-free default draft: stochastic n-gram / prompt lookup (models.ngram)."""

    def __init__(self, vocab_size: int, params: SamplingParams, max_n: int = 3):
        self.model = NGramDraft(vocab_size, max_n=max_n)
        self.vocab_size = vocab_size
        self.params = params
        self.calls = 0

    def reset(self, prompt_ids):
        self.model.reset(prompt_ids)

    def begin_round(self) -> DraftFn:
        def score(prefixes):
            self.calls += 1
            return list(process_probs(np.stack([self.model.probs(p) for p in prefixes]), self.params))

        return _RoundFn(score)

    def commit(self, accepted, next_token):
        self.model.append(list(accepted) + [int(next_token)])


class ModelDrafter:
    """A KV-cached neural draft (``models.hf.HFModelAdapter``); each tree level is one forward."""

    def __init__(self, adapter, params: SamplingParams):
        self.adapter = adapter
        self.vocab_size = adapter.vocab_size
        self.params = params
        self.calls = 0
        self._nodes: dict[tuple[int, ...], int] = {}

    def reset(self, prompt_ids):
        self.adapter.reset(prompt_ids)
        self._nodes = {}

    def begin_round(self) -> DraftFn:
        self._nodes = {}
        return _RoundFn(self._score)

    def _score(self, prefixes):
        tokens, parents = [], []
        first = len(self._nodes)
        for prefix in prefixes:
            node = first + len(tokens)
            if prefix:
                parents.append(self._nodes[prefix[:-1]])
                tokens.append(prefix[-1])
            else:
                parents.append(-1)
                tokens.append(-1)
            self._nodes[prefix] = node
        self.calls += 1
        logits = self.adapter.extend(tokens, parents)
        return list(logits_to_probs(logits, self.params))

    def commit(self, accepted, next_token):
        accepted = [int(t) for t in accepted]
        path = []
        for depth in range(1, len(accepted) + 1):
            node = self._nodes.get(tuple(accepted[:depth]))
            if node is None:
                break
            path.append(node)
        if not self._nodes:  # nothing was drafted this round
            self.adapter.append_committed(accepted, next_token)
        elif len(path) == len(accepted):
            self.adapter.commit(path, next_token)
        else:
            # the deepest accepted tokens were never fed to the draft (leaves): they ride along
            # in its next forward
            self.adapter.commit(path, accepted[len(path)])
            self.adapter.append_committed(accepted[len(path) + 1 :], next_token)
        self._nodes = {}


class TokenTreeDrafter:
    """Training-free target-aware token trees: one deterministic candidate tree per round.

    Candidates come from the target itself and the context, at no model cost:
    * adjacency: the target's top-k next tokens after each token id, refreshed from the logits of
      every scored node of every target forward (``observe_target``; ``models.token_tree``);
    * copies: continuations of the longest suffix matches of the context anywhere in the prompt
      and the generated text (``SuffixIndex``), up to ``copy_matches`` distinct continuations.
    ``draft.tree_policy`` grows the tree best first from running acceptance estimates and keeps
    the size that maximises expected tokens per second (``cost``: a fixed ``CostCurve``, or None
    for the cost table the engine passes each round, ``engine.cost_model.OnlineCostModel``); with
    no useful candidate the tree is the root alone, and ``probes`` forces a small tree now and then
    so the estimates keep learning. The tree has no sampling law q (DraftScheme.DETERMINISTIC):
    verify it with a q-free rule (``qfree``). The adjacency table persists across ``reset``: it
    describes the target, not one prompt (pass ``adjacency`` to share one between drafters).

    ``prior_scale``: the acceptance estimates' prior (``AcceptanceEstimates.prior_scale``; a
    target adapter's ``acceptance_prior_scale``). ``shadow_trials``: a round that scores the root
    alone still counts as trials of its root candidates (a hit when the emitted token is theirs):
    the q-free walk draws that token from the target's row whatever the children, exactly as it
    would have decided between them, so these are the trials a depth-1 tree would have seen, at
    no forward cost, and a pessimistic prior learns which classes pay without speculating.

    ``rest`` (None: never; a target adapter's ``rest_after``, on llama.cpp only: on torch's bf16
    curve resting delayed the trees that pay, 1.44x -> 1.39x plain on the tuning prompts): after
    ``rest.after`` rounds in a row that scored the root alone, the drafter *rests*:
    ``resting()`` is True and the engine decodes the round plainly, without looking up candidates
    or refreshing the adjacency table (that work costs ~0.7 ms a round against a ~7.5 ms plain step
    on llama.cpp, ~9%); every ``rest.wake_every``-th round it proposes as usual (its shadow trials
    and probes keep learning there), and the first tree it drafts ends the rest. Deciding alone
    only (a batch's budget sizes every round). Exact: whether a round rests depends on past rounds
    only, and a resting round draws the root's token exactly as a root-only q-free walk does.
    """

    deterministic = True

    def __init__(
        self,
        vocab_size: int,
        k: int = 8,
        max_nodes: int = 24,
        max_depth: int = 12,
        copy_matches: int = 3,
        cost: CostTable | None = None,
        adjacency=None,
        probes: ProbeSchedule | None = None,
        prior_scale: float = 1.0,
        shadow_trials: bool = True,
        rest: RestSchedule | None = None,
    ):
        if max_nodes < 0 or max_depth < 1:
            raise ConfigError(f"a token tree needs max_nodes >= 0 and max_depth >= 1, got {max_nodes}, {max_depth}")
        self.vocab_size = int(vocab_size)
        self.calls = 0  # no draft model: never any draft forward
        self.max_nodes = int(max_nodes)
        self.max_depth = int(max_depth)
        self.copy_matches = int(copy_matches)
        self.cost = cost  # None: the engine's online cost table, passed to ``propose``
        self.probes = ProbeSchedule() if probes is None else probes
        self.adjacency = adjacency if adjacency is not None else AdjacencyTable(vocab_size, k)
        if self.adjacency.vocab_size != self.vocab_size:
            raise ConfigError(f"adjacency table has {self.adjacency.vocab_size} tokens, the draft {self.vocab_size}")
        self.index = SuffixIndex()
        self.estimates = AcceptanceEstimates(prior_scale=prior_scale)
        self.shadow_trials = bool(shadow_trials)
        self.rest = RestSchedule(after=0) if rest is None else rest  # None: never rests
        # the price of time in the size policy (``best_prefix``): tokens per plain round's time, from
        # past rounds; like the estimates it describes the target and the machine, so it survives ``reset``
        self.rate = LongRunRate()
        self._relative_cost = 1.0  # this round's modelled cost over a plain round's (``propose``)
        # a root-only round's root candidates, recorded as trials once its token is known (commit)
        self._shadow: tuple[Candidate, ...] = ()
        self._root: list[Candidate] = []  # this round's root candidates
        self._rates: dict = {}
        # per round (the table and the rates do not change while a tree grows): a token's adjacency
        # candidates, and its children when no copy continues there; a tree repeats tokens often
        self._adjacent_of: dict[int, list[Candidate]] = {}
        self._children_of: dict[int, list[Candidate]] = {}
        # set by a batch (engine.batch): offered best-first order (grown as far as the batch asks)
        # -> (nodes to keep, the decision), instead of the cut by ``cost``; None: this drafter decides alone
        self.planner: Callable[[BestFirstOrder], tuple[int, object]] | None = None
        # set by a batch that refreshes the shared adjacency table itself, from every sequence's
        # scored rows at once after each batched forward (engine.batch ``_refresh_adjacency``):
        # ``observe_target`` then leaves the table alone, and ``scoring`` holds the tokens of the
        # tree this sequence has queued for that forward (None: none)
        self.batch_refresh = False
        self.scoring: tuple[int, ...] | None = None

    def reset(self, prompt_ids):
        self.index.reset(prompt_ids)
        self.rest = replace(self.rest, quiet=0, rested=0)  # a new prompt's copies get their look first

    # ----- one round ----------------------------------------------------------------------
    def propose(self, max_depth: int | None = None, cost: CostTable | None = None):
        """This round's ``CandidateTree`` below the last context token, at most ``max_depth`` deep
        (default ``self.max_depth``; the engine passes less near the end of the target's context),
        sized by ``self.cost`` when fixed, else by ``cost`` (the engine's online table).

        When no tree can beat the root alone (``root_alone_wins``, from the best root candidate)
        and no probe is due, the root alone is returned without growing the tree, so a round that
        drafts nothing costs about what a plain decoding step costs; its ``offered`` is then None
        (``offered_tree`` grows it, for oracles). In a batch (``planner`` set) the batch budget cuts
        the offered order instead, priced by the batched forward, growing it (``BestFirstOrder``)
        only as far as its merge reads; the tree's ``offered`` then holds what was grown. A root-only tree keeps its
        root candidates for the shadow trials ``commit`` records (``shadow_trials``)."""
        tree = self._propose(max_depth, cost)
        if tree.num_nodes > 1 and self.planner is None:
            table = self._cost(cost).table(tree.num_nodes)
            self._relative_cost = float(table[-1] / table[0])
        if self.batch_refresh:
            self.scoring = tree.tokens
        self._shadow = tuple(self._root) if tree.num_nodes == 1 and self.shadow_trials else ()
        self.rest.record(tree.num_nodes > 1)
        return tree

    def resting(self) -> bool:
        """Whether the engine decodes this round plainly without proposing (``rest``); a sequence in
        a batch never rests (the batch budget decides each round)."""
        return self.planner is None and self.rest.rests()

    def _propose(self, max_depth: int | None, cost: CostTable | None) -> CandidateTree:
        cost = self._cost(cost)
        root, depth = self._root_candidates(max_depth)
        self._root = root
        token = self.index.context[-1]
        if self.planner is not None:  # a batch: its budget cuts the offered order, for all sequences at once
            # grown by the split as far as it reads (in the scheduler's turn, once every sequence's
            # feedback of the last round is in the shared estimates), not whole before offering it
            order = BestFirstOrder(token, root, self._expand, self.max_nodes, depth)
            nodes, plan = self.planner(order)
            # two nodes tell whether the whole order has more than the root (a probe's condition)
            if order.grow(max(nodes, 2)) > 1 and self.probes.due(nodes > 1, cost):
                order.grow(1 + self.probes.size)
                return replace(order.tree().prefix(1 + self.probes.size), probe=True)
            return replace(order.tree().prefix(nodes), plan=plan)
        best = max((c.accept for c in root), default=0.0)
        rate = self.rate.value
        if best > 0.0 and self.max_nodes >= 1 and root_alone_wins(best, cost, self.max_nodes, rate):
            # grow_tree would keep the root alone while offering more (a root candidate scores > 0)
            if not self.probes.due(False, cost):
                return CandidateTree((token,), (-1,), (None,), (1.0,), 1.0)
            tree = grow_tree(token, root, self._expand, cost, self.max_nodes, depth, rate)
            return replace(tree.offered.prefix(1 + self.probes.size), probe=True)
        tree = grow_tree(token, root, self._expand, cost, self.max_nodes, depth, rate)
        if tree.offered.num_nodes > 1 and self.probes.due(tree.num_nodes > 1, cost):
            return replace(tree.offered.prefix(1 + self.probes.size), probe=True)
        return tree

    def offered_tree(self, max_depth: int | None = None, cost: CostTable | None = None) -> CandidateTree:
        """The whole best-first order this round offers (what ``propose`` cuts), grown from the same
        state: call it after ``propose`` and before the round's feedback. Touches no probe count."""
        root, depth = self._root_candidates(max_depth)
        return grow_tree(self.index.context[-1], root, self._expand, self._cost(cost), self.max_nodes, depth).offered

    def _cost(self, cost: CostTable | None) -> CostTable:
        cost = self.cost if self.cost is not None else cost
        if cost is None:
            raise ConfigError("a token tree needs a cost table: pass cost= (a CostCurve) or let the engine pass its own")
        return cost

    def _root_candidates(self, max_depth: int | None):
        """(the root's candidates, best first; the depth limit) from the current estimates."""
        self._rates, self._adjacent_of, self._children_of = {}, {}, {}
        copies = [self._copy(m.start, m.match_len) for m in self.index.matches(self.copy_matches)]
        root = self._merge(copies, self.index.context[-1])
        return root, self.max_depth if max_depth is None else max(1, min(self.max_depth, max_depth))

    def _rate(self, cls) -> float:
        rate = self._rates.get(cls)
        if rate is None:
            rate = self._rates[cls] = self.estimates.rate(cls)
        return rate

    def _copy(self, start: int, match_len: int):
        """A copy candidate, classed by its match length only (``_merge`` adds its rank)."""
        cls = ("copy", copy_bucket(match_len))
        return Candidate(self.index.context[start], self._rate((*cls, 0)), cls, start, match_len)

    def _adjacent(self, token: int) -> list[Candidate]:
        """The adjacency row of ``token`` as candidates, in the table's order, classed by recorded
        probability only (``_merge`` adds the rank; cached for the round)."""
        found = self._adjacent_of.get(token)
        if found is None:
            ids, probs = self.adjacency.candidates(token)
            found = []
            for next_token, prob in zip(ids, probs):
                cls = ("adj", adjacency_bucket(prob))
                found.append(Candidate(next_token, self._rate((*cls, 0)), cls))
            self._adjacent_of[token] = found
        return found

    def _merge(self, copies, token: int):
        """The children of a node: copy candidates plus the adjacency row of ``token``, ranked.

        Siblings exclude each other (the walk moves into at most one), so how likely a candidate is
        right depends on what it competes with: its class is (source, bucket, rank), the rank its
        place among its siblings by their learned rank-0 rates, ties broken by the shipped rank-0
        priors (``ACCEPT_PRIOR``: under llama.cpp's zero prior every rate starts at 0, and the
        priors, not arrival order, then rank the siblings; ``SIBLING_RANKS``: 0, 1, or 2 for the
        rest), and its estimate that class's learned rate. A token offered by both sources (the first copy
        offering it keeps its copy state) is right if either source would be, 1 - (1 - a)(1 - b)
        over the two classes' rates (an optimistic union), and is classed by the likelier one."""
        if not copies and token in self._children_of:
            return self._children_of[token]
        sources: dict[int, tuple[Candidate, list]] = {}  # token -> (candidate, its unranked classes)
        for candidate in [*copies, *self._adjacent(token)]:
            known = sources.get(candidate.token)
            if known is None:
                sources[candidate.token] = (candidate, [candidate.cls])
            elif candidate.cls[0] not in (cls[0] for cls in known[1]):
                known[1].append(candidate.cls)
        base = sorted(sources.values(), key=lambda entry: (-self._union(entry[1], 0), -_prior_union(entry[1])))
        children = []
        for rank, (candidate, classes) in enumerate(base):
            rank = min(rank, SIBLING_RANKS - 1)
            ranked = [(*cls, rank) for cls in classes]
            best = max(ranked, key=self._rate)
            # the constructor, not dataclasses.replace (~3x its cost; a tree's growth makes ~25 a round per sequence)
            children.append(Candidate(candidate.token, self._union(classes, rank), best, candidate.copy_start, candidate.copy_match))
        children.sort(key=lambda c: -c.accept)
        if not copies:
            self._children_of[token] = children
        return children

    def _union(self, classes, rank: int) -> float:
        """The chance that either source is right: ``_either`` of ``classes``' (unranked) rates at ``rank``."""
        return _either([self._rate((*cls, rank)) for cls in classes])

    def _expand(self, candidate, depth: int):
        context = self.index.context
        copies = []
        if candidate.copy_start is not None and candidate.copy_start + 1 < len(context):
            copies.append(self._copy(candidate.copy_start + 1, candidate.copy_match + 1))
        return self._merge(copies, candidate.token)

    # ----- feedback -------------------------------------------------------------------------
    def observe_target(self, tokens, parents, logits) -> None:
        """The target's logits (n, V) at the scored nodes (tokens (n,), parents (n,)): refresh
        the adjacency rows of their tokens (in a batch that refreshes them itself, nothing)."""
        if not self.batch_refresh:
            self.adjacency.update(tokens, logits)

    def observe_walk(self, tree, visited) -> None:
        """Update the acceptance estimates: every child of a visited node is a trial of its
        class, a hit when the walk moved into it."""
        if tree.num_nodes == 1 and self._shadow:
            return  # ``commit`` records the root's shadow trials: one record (one decay) per round
        kids = tree.children_of()
        outcomes = []
        for position, node in enumerate(visited):
            moved_to = visited[position + 1] if position + 1 < len(visited) else None
            outcomes += [(tree.classes[child], child == moved_to) for child in kids[node].values()]
        self.estimates.record(outcomes)

    def commit(self, accepted, next_token):
        if self.planner is None:  # alone (a batch's budget prices its own rounds)
            self.rate.record(len(accepted) + 1, self._relative_cost)  # resting or root-only: 1 plain round
        self._relative_cost = 1.0
        if self._shadow:
            self.estimates.record([(c.cls, c.token == int(next_token)) for c in self._shadow])
            self._shadow = ()
        self.index.extend([*accepted, int(next_token)])


def _prior_union(classes) -> float:
    """``_either`` of ``classes``' (unranked) shipped priors at rank 0: how tied siblings are ranked."""
    return _either([ACCEPT_PRIOR[(source, bucket, 0)] for source, bucket in classes])


def _either(rates) -> float:
    """1 - prod(1 - rate): at least one of independent events happens (one rate: itself, exactly)."""
    if len(rates) == 1:
        return rates[0]
    miss = 1.0
    for rate in rates:
        miss *= 1.0 - rate
    return 1.0 - miss


def default_method(draft) -> str:
    """The rule used when none is given (``method=None``; the server's default too): q-free over
    the token trees, else the drafter-invariant chain rule ``gumbel``."""
    return "qfree" if is_token_tree(draft) else "gumbel"


def is_token_tree(draft) -> bool:
    """The token-tree draft: "tree", None (the default draft) or a ``TokenTreeDrafter``."""
    return draft is None or (isinstance(draft, str) and draft == "tree") or isinstance(draft, TokenTreeDrafter)


def start_adjacency(drafter, adjacency, vocab_size: int) -> None:
    """Start a token-tree ``drafter`` from a copy of ``adjacency`` (an ``AdjacencyTable``, or the path
    of one written by ``AdjacencyTable.save``), for a target of ``vocab_size`` tokens: a decoder's
    ``adjacency=``. Refused for any other draft, and for a table of another vocabulary."""
    if not isinstance(drafter, TokenTreeDrafter):
        kind = "none (plain decoding)" if drafter is None else type(drafter).__name__
        raise ConfigError(f"adjacency= / --adjacency starts the token-tree draft's table; this decoder's draft is {kind}: "
                          "drop it, or use the token-tree draft (draft='tree')")
    table = AdjacencyTable.load(adjacency, vocab_size) if isinstance(adjacency, (str, PathLike)) else copy.deepcopy(adjacency)
    if table.vocab_size != vocab_size:
        raise ConfigError(f"the adjacency table has {table.vocab_size} tokens, the target {vocab_size}; use a table made with this target")
    drafter.adjacency = table
