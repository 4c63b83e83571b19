"""Mutants of the decoding engine and its drafting policy (src/verispec/engine, src/verispec/draft):
the batch budget, the batch engine with a draft model, the cost model, the acceptance estimates,
sibling ranks, and resting rounds."""

from __future__ import annotations

from .base import BATCH_DRAFT_TESTS, Mutant

ACCEPTANCE_PRIOR = "tests/engine/test_acceptance_prior.py"
REST_TESTS = "tests/engine/test_rest_schedule.py"

MUTANTS = [
    # the batch budget (engine/batch_budget.py) and the share of it each sequence drafts
    Mutant(
        "batch_budget_costs_one_sequence",
        "the batch budget prices each tree as if its sequence were alone (cost of 1 + nodes, not of the whole forward)",
        (("engine/batch_budget.py", "    base = fixed_tokens + batch  # the roots", "    base = 1  # the roots"),),
        ("tests/engine/test_batch_budget.py",),
    ),
    Mutant(
        "batch_budget_ignores_queued_tokens",
        "the batch budget leaves out the tokens other sequences already queued for the same forward",
        (("engine/batch_budget.py", "    base = fixed_tokens + batch  # the roots", "    base = batch  # the roots"),),
        ("tests/engine/test_batch_budget.py",),
    ),
    Mutant(
        "batch_share_ignored",
        "a sequence of a batch scores all it grew of its tree instead of the share the batch budget gave it",
        (("engine/drafters.py", "            return replace(order.tree().prefix(nodes), plan=plan)", "            return replace(order.tree(), plan=plan)"),),
        ("tests/engine/test_batch_engine.py::test_the_batch_budget_sizes_trees_and_chains_and_its_decision_is_in_the_stats",),
    ),
    Mutant(
        "batch_budget_worst_first",
        "the batch budget merges the offers worst first (kept nodes are no longer the most promising)",
        (("engine/batch_budget.py", "key=lambda score: -score)", "key=lambda score: score)"),),
        ("tests/engine/test_batch_budget.py",),
    ),
    Mutant(
        "batch_merge_stops_early",
        "the batch budget's lazy merge stops while a longer prefix could still gain more",
        (("engine/batch_budget.py", "best - (batch + gained - prices[taken]) - 1e-9)", "best - (batch + gained - prices[taken]) + 0.5)"),),
        ("tests/engine/test_batch_budget.py",),
    ),
    Mutant(
        "batch_split_by_ratio",
        "the batch budget keeps the prefix with the best tokens per second, not the gain over plain batched decoding",
        (("engine/batch_budget.py", "        value = (batch + gained) - prices[taken + 1]", "        value = (batch + gained) / seconds[taken + 1]"),
         ("engine/batch_budget.py", "best, best_expected = 0, batch - prices[0], float(batch)", "best, best_expected = 0, batch / seconds[0], float(batch)")),
        ("tests/engine/test_batch_budget.py",),
    ),

    # the batch engine (engine/batch.py): batched draft forwards, draft slots, the shared adjacency table
    Mutant(
        "batch_draft_rows_rotated",
        "the batched draft forward hands each sequence the next sequence's rows (still exact in law: only the seeded solo comparison sees it)",
        (("engine/batch.py", "                turns = drafting\n",
          "                rows = self.draft_runner._results; order = sorted(rows)\n"
          "                self.draft_runner._results = dict(zip(order, [rows[s] for s in order[1:] + order[:1]]))\n"
          "                turns = drafting\n"),),
        (BATCH_DRAFT_TESTS + "::test_seeded_batch_with_a_draft_model_equals_each_prompt_alone",),
    ),
    Mutant(
        "batch_draft_unbatched",
        "each sequence's draft model runs on its own solo runner: same tokens, but no batched draft forward",
        (("engine/batch.py", "        return HFModelAdapter(self._draft_base.model, runner=seq.draft_slot)",
          "        return HFModelAdapter(self._draft_base.model)"),),
        (BATCH_DRAFT_TESTS,),
    ),
    Mutant(
        "batch_draft_waits_at_the_target",
        "a sequence paused at its draft forward is taken as waiting on the target (its draft forward never runs)",
        (("engine/batch.py", 'self._pause(seq, "draft")', 'self._pause(seq, "target")'),),
        (BATCH_DRAFT_TESTS,),
    ),
    Mutant(
        "batch_draft_slot_leak",
        "a finished sequence keeps its draft slot (the draft cache grows with every sequence)",
        (("engine/batch.py", "            self.draft_runner.close(seq.draft_slot)\n", "            pass\n"),),
        (BATCH_DRAFT_TESTS,),
    ),
    Mutant(
        "batch_overhead_without_drafts",
        "the batch cost model learns no overhead (the batched draft forwards before the target forward go unpriced)",
        (("engine/batch.py", "self.decoder.batch_cost_model.record(scored, end - tic, tic - round_start)",
          "self.decoder.batch_cost_model.record(scored, end - tic, 0.0)"),),
        (BATCH_DRAFT_TESTS + "::test_the_batch_budget_prices_the_draft_forwards_in_the_round",),
    ),
    Mutant(
        "batch_adjacency_refresh_skips_last_sequence",
        "the batch's adjacency refresh leaves out the last sequence's scored rows",
        (("engine/batch.py", "        for seq in running:\n            drafter = getattr(seq.decoder, \"drafter\", None)\n            if seq.done",
          "        for seq in running[:-1]:\n            drafter = getattr(seq.decoder, \"drafter\", None)\n            if seq.done"),),
        ("tests/engine/test_batch_engine.py::test_the_batch_refreshes_the_shared_adjacency_table_once_per_forward",),
    ),

    # the cost model (engine/cost_model.py) and the probes it prices (draft/tree_policy.py)
    Mutant(
        "probe_ignores_its_cost",
        "probes come every + 1 rounds apart whatever a probe costs (where forwards cost linearly they take a fifth of the time)",
        (("draft/tree_policy.py", "        return max(self.every, math.ceil(extra / self.max_overhead) - 1)", "        return self.every"),),
        ("tests/engine/test_cost_model.py",),
    ),
    Mutant(
        "cost_pseudo_readings_at_the_prior",
        "a bucket's pseudo-readings sit at the prior (zeros) instead of the ratio pooled over the other sizes",
        (("engine/cost_model.py", "        pseudo = [pooled] * self.prior_weight", "        pseudo = [0.0] * self.prior_weight"),),
        ("tests/engine/test_cost_model.py",),
    ),
    Mutant(
        "cost_prior_ignored",
        "the decoder ignores its target's cost prior (llama.cpp's first rounds are sized as if extra tokens were free)",
        (("engine/decoder.py", '        prior = getattr(self.target, "cost_prior", None)', "        prior = None"),),
        ("tests/engine/test_cost_model.py",),
    ),
    Mutant(
        "cost_tables_kept_stale",
        "a reading does not renew the cost tables kept between readings (the policy never follows the machine)",
        (("engine/cost_model.py", "        self._estimates = None\n        self._stale = True", "        self._estimates = None"),),
        ("tests/engine/test_cost_model.py",),
    ),
    Mutant(
        "standing_seconds_recomputed",
        "a resting round recomputes the cost model's estimates for its prediction (the ~40 us a round it was made to save)",
        (("engine/cost_model.py", "        if self._table is not None and self._table.size >= scored_tokens:\n            return float(self._table[scored_tokens - 1])\n", ""),),
        ("tests/engine/test_cost_model.py",),
    ),

    # the acceptance estimates and shadow trials (engine/drafters.py, draft/tree_policy.py)
    Mutant(
        "shadow_always_hits",
        "a root-only round's shadow trials count every root candidate as accepted (the estimates grow optimistic)",
        (("engine/drafters.py", "(c.cls, c.token == int(next_token))", "(c.cls, True)"),),
        (ACCEPTANCE_PRIOR,),
    ),
    Mutant(
        "acceptance_prior_unscaled",
        "the acceptance estimates ignore prior_scale (llama.cpp's fresh decoders draft from the optimistic prior)",
        (("draft/tree_policy.py", "self.prior_weight * self.prior_scale * self.prior(cls)", "self.prior_weight * self.prior(cls)"),),
        (ACCEPTANCE_PRIOR,),
    ),
    Mutant(
        "acceptance_prior_ignored",
        "the decoder ignores its target's acceptance_prior_scale",
        (("engine/decoder.py", 'prior_scale=getattr(self.target, "acceptance_prior_scale", 1.0)', "prior_scale=1.0"),),
        (ACCEPTANCE_PRIOR,),
    ),
    Mutant(
        "shadow_double_decay",
        "a root-only round with shadow trials decays the estimates twice (observe_walk and commit both record)",
        (("engine/drafters.py", "        if tree.num_nodes == 1 and self._shadow:\n            return", "        if False:\n            return"),),
        (ACCEPTANCE_PRIOR,),
    ),
    Mutant(
        "shadow_on_real_trees",
        "a round that scored a real tree also records its root candidates as shadow trials (counted twice)",
        (("engine/drafters.py", "if tree.num_nodes == 1 and self.shadow_trials else ()", "if self.shadow_trials else ()"),),
        (ACCEPTANCE_PRIOR,),
    ),

    # sibling ranks and the tree's size (engine/drafters.py, draft/tree_policy.py)
    Mutant(
        "sibling_rank_ignored",
        "every candidate is classed as the best sibling (a second-place adjacency candidate keeps its rank-0 rate)",
        (("engine/drafters.py", "            rank = min(rank, SIBLING_RANKS - 1)", "            rank = 0"),),
        ("tests/engine/test_sibling_ranks.py",),
    ),
    Mutant(
        "sibling_rank_by_learned_rates",
        "siblings are ranked by their learned rates alone (all 0 under a zero prior, so ties rank them by arrival)",
        (("engine/drafters.py", "        base = sorted(sources.values(), key=lambda entry: (-self._union(entry[1], 0), -_prior_union(entry[1])))",
          "        base = sorted(sources.values(), key=lambda entry: -self._union(entry[1], 0))"),),
        ("tests/engine/test_sibling_ranks.py",),
    ),
    Mutant(
        "merge_union_dropped",
        "a token offered by a copy and the adjacency row keeps only its better source's rate",
        (("engine/drafters.py", "        miss *= 1.0 - rate", "        miss = min(miss, 1.0 - rate)"),),
        ("tests/engine/test_sibling_ranks.py",),
    ),
    Mutant(
        "best_prefix_by_round_ratio",
        "the tree keeps the prefix with the round's best tokens-per-cost ratio instead of the gain over plain decoding",
        (("draft/tree_policy.py", "        gain = 1.0 + total - rated_price(costs[nodes - 1] / plain, rate)",
          "        gain = (1.0 + total) / (costs[nodes - 1] / plain) - 1.0"),),
        ("tests/draft/test_tree_policy.py",),
    ),
    Mutant(
        "best_prefix_prices_time_at_plain_rate",
        "the tree's cut ignores the running rate: time priced at plain decoding's rate whatever the decoder reaches",
        (("draft/tree_policy.py", "        gain = 1.0 + total - rated_price(costs[nodes - 1] / plain, rate)",
          "        gain = 1.0 + total - rated_price(costs[nodes - 1] / plain, 1.0)"),),
        ("tests/draft/test_tree_policy.py",),
    ),
    Mutant(
        "root_alone_bound_at_plain_rate",
        "the shortcut's bound prices time at plain decoding's rate while the cut prices it at the running rate",
        (("draft/tree_policy.py", "rated_price(costs[nodes] / plain, rate) < 0.0", "costs[nodes] / plain < 0.0"),),
        ("tests/draft/test_tree_policy.py",),
    ),
    Mutant(
        "running_rate_without_bonus_token",
        "the running rate counts the accepted tokens of a round but not the token the target adds",
        (("engine/drafters.py", "self.rate.record(len(accepted) + 1, self._relative_cost)", "self.rate.record(len(accepted), self._relative_cost)"),),
        ("tests/engine/test_cost_model.py",),
    ),
    Mutant(
        "running_rate_round_costs_one_plain_round",
        "the running rate counts every round as one plain round's time, whatever its tree cost",
        (("engine/drafters.py", "            self._relative_cost = float(table[-1] / table[0])", "            self._relative_cost = 1.0"),),
        ("tests/engine/test_cost_model.py",),
    ),
    Mutant(
        "running_rate_below_plain",
        "the running rate may sink below plain decoding's (time priced under what plain rounds earn)",
        (("draft/tree_policy.py", "        return max(1.0, self.tokens / self.plain_rounds)", "        return self.tokens / self.plain_rounds"),),
        ("tests/draft/test_tree_policy.py",),
    ),

    # resting rounds (engine/decoder.py, draft/tree_policy.py)
    Mutant(
        "rest_round_skips_drafter_commit",
        "a resting round decodes plainly but does not tell the drafter (its context index falls out of step)",
        (("engine/decoder.py", "                self.drafter.commit([], output_tokens[0])\n                decision = RoundDecision(1, 1.0",
          "                decision = RoundDecision(1, 1.0"),),
        (REST_TESTS,),
    ),
    Mutant(
        "rest_never_wakes",
        "a resting drafter never proposes again (no shadow trials, no probes: speculation never restarts)",
        (("draft/tree_policy.py", " or self.rested + 1 >= self.wake_every:", ":"),),
        (REST_TESTS,),
    ),
]
