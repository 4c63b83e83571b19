"""OTM: the optimal single-position coupling as a linear program (ALGORITHMS.md §10).
A reference with exponential cost (V^K tuples), for small vocabularies only.

LP for a joint draft law Q on ordered K-tuples: one variable pi(x, y) per tuple x with Q(x) > 0
and per distinct token y in x;
    maximise sum pi   s.t.   sum_y pi(x, y) <= Q(x),   sum_{x contains y} pi(x, y) <= p(y),   pi >= 0,
solved with HiGHS (``scipy.optimize.linprog(method="highs")``).

Verifier (lossless for any feasible plan): given the drafted tuple x accept y with probability
pi(x, y)/Q(x); otherwise y ~ p_res, p_res(y) ∝ p(y) - sum_x pi(x, y), independent of x.
``OTM`` applies this per position, top-down (a heuristic for L > 1, §10), with the k alive
i.i.d. candidates of §5.2 as an ordered k-tuple with joint q^{⊗k} (schemes CHAIN, IID_PATHS).

Closed form for i.i.d. drafts: alpha* = min_{A ⊆ V} p(A) + 1 - q(A)^K (max-flow = min-cut).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np
import scipy.sparse
from scipy.optimize import linprog

from verispec.core.probs import RESIDUAL_MASS_GUARD
from verispec.core.rng import Rng
from verispec.core.tree import DraftScheme, DraftTree
from verispec.errors import ConfigError
from verispec.verify.base import Verifier, VerifyResult
from verispec.verify.rrs import top_down

MAX_TUPLES = 20_000
MAX_CLOSED_FORM_VOCAB = 12


@dataclass(frozen=True)
class OTMPlan:
    """Solution of the §10 LP, cleaned to be exactly feasible.

    tuples       (T, K) int64, the tuples with Q > 0
    joint        (T,)   Q(x) of each tuple
    var_tuple    (N,)   tuple index of each LP variable
    var_token    (N,)   token y of each LP variable (distinct within a tuple)
    plan         (N,)   pi(x, y) >= 0, with row sums <= Q(x) and column sums <= p(y)
    target       (V,)   p
    """

    tuples: np.ndarray
    joint: np.ndarray
    var_tuple: np.ndarray
    var_token: np.ndarray
    plan: np.ndarray
    target: np.ndarray

    @property
    def acceptance(self) -> float:
        """sum pi: the probability that the verifier outputs one of the drafted tokens."""
        return float(self.plan.sum())

    @cached_property
    def _index(self) -> dict[tuple[int, ...], int]:
        return {tuple(int(t) for t in row): i for i, row in enumerate(self.tuples)}

    @cached_property
    def _vars_by_tuple(self) -> np.ndarray:
        """Start offsets of each tuple's variables (variables are grouped by tuple)."""
        return np.searchsorted(self.var_tuple, np.arange(len(self.tuples) + 1))

    def pi_matrix(self) -> np.ndarray:
        """pi as a (T, V) array."""
        out = np.zeros((len(self.tuples), self.target.size))
        out[self.var_tuple, self.var_token] = self.plan
        return out

    def accept_probs(self, drafted: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
        """(tokens, pi(x, token)/Q(x)) for the drafted tuple x, tokens in first-appearance order."""
        key = tuple(int(t) for t in drafted)
        if key not in self._index:
            raise ConfigError(f"drafted tuple {key} has probability 0 under the joint the OTM plan was solved for")
        row = self._index[key]
        start, stop = self._vars_by_tuple[row], self._vars_by_tuple[row + 1]
        return self.var_token[start:stop], self.plan[start:stop] / self.joint[row]

    @cached_property
    def residual(self) -> np.ndarray | None:
        """p_res ∝ p - sum_x pi(x, .), shape (V,); None when the plan accepts with probability 1."""
        weights = self.target - np.bincount(self.var_token, weights=self.plan, minlength=self.target.size)
        np.maximum(weights, 0.0, out=weights)
        mass = weights.sum()
        if not mass > RESIDUAL_MASS_GUARD:
            return None
        return weights / mass


def _joint_entries(joint, vocab_size: int) -> tuple[np.ndarray, np.ndarray]:
    """(tuples (T, K), probabilities (T,)) of the tuples with positive probability."""
    if isinstance(joint, dict):
        items = [(tuple(int(t) for t in key), float(prob)) for key, prob in joint.items() if prob > 0]
        if not items:
            raise ConfigError("the joint draft law has no tuple with positive probability")
        lengths = {len(key) for key, _ in items}
        if len(lengths) != 1:
            raise ConfigError(f"all drafted tuples must have the same length K, got lengths {sorted(lengths)}")
        tuples = np.array([key for key, _ in items], dtype=np.int64)
        probs = np.array([prob for _, prob in items])
    else:
        array = np.asarray(joint, dtype=np.float64)
        if any(size != vocab_size for size in array.shape):
            raise ConfigError(f"a joint array over K-tuples needs shape (V,)*K with V = {vocab_size}, got {array.shape}")
        if array.size > MAX_TUPLES:
            raise ConfigError(f"OTM is an exponential reference; use V^K <= {MAX_TUPLES} (got {array.size} tuples)")
        tuples = np.argwhere(array > 0).astype(np.int64)
        probs = array[tuple(tuples.T)]
    if np.any(tuples < 0) or np.any(tuples >= vocab_size):
        raise ConfigError(f"drafted tuples must hold token ids in [0, {vocab_size})")
    if len(tuples) > MAX_TUPLES:
        raise ConfigError(f"OTM is an exponential reference; use V^K <= {MAX_TUPLES} (got {len(tuples)} tuples)")
    return tuples, probs


def otm_plan(target: np.ndarray, joint) -> OTMPlan:
    """Solve the §10 LP for target p (shape (V,)) and a joint draft law over ordered K-tuples,
    given as a dict {tuple: probability} or an array of shape (V,)*K.

    The HiGHS solution is cleaned so that every constraint holds exactly (negative entries
    clipped, rows then columns scaled down where they exceed Q(x) or p(y)); the verifier built on
    the cleaned plan is exactly lossless.
    """
    target = np.asarray(target, dtype=np.float64)
    vocab = target.size
    tuples, probs = _joint_entries(joint, vocab)
    num_tuples, k = tuples.shape
    # a variable per (tuple, distinct token): position j is a first appearance within its tuple
    first = np.ones((num_tuples, k), dtype=bool)
    for j in range(1, k):
        first[:, j] = np.all(tuples[:, :j] != tuples[:, j : j + 1], axis=1)
    var_tuple, var_pos = np.nonzero(first)  # row-major: grouped by tuple, positions ascending
    var_token = tuples[var_tuple, var_pos]
    num_vars = var_tuple.size
    columns = np.arange(num_vars)
    constraints = scipy.sparse.csr_matrix(
        (np.ones(2 * num_vars), (np.concatenate([var_tuple, num_tuples + var_token]), np.concatenate([columns, columns]))),
        shape=(num_tuples + vocab, num_vars),
    )
    bounds = np.concatenate([probs, target])
    solution = linprog(-np.ones(num_vars), A_ub=constraints, b_ub=bounds, bounds=(0, None), method="highs")
    if solution.status != 0:
        raise ConfigError(f"the OTM linear program failed: {solution.message}")
    plan = np.maximum(solution.x, 0.0)
    row_sums = np.bincount(var_tuple, weights=plan, minlength=num_tuples)
    with np.errstate(divide="ignore", invalid="ignore"):
        row_scale = np.where(row_sums > probs, probs / row_sums, 1.0)
    plan = plan * row_scale[var_tuple]
    col_sums = np.bincount(var_token, weights=plan, minlength=vocab)
    with np.errstate(divide="ignore", invalid="ignore"):
        col_scale = np.where(col_sums > target, target / col_sums, 1.0)
    plan = plan * col_scale[var_token]
    return OTMPlan(tuples, probs, var_tuple, var_token, plan, target)


def iid_joint(draft: np.ndarray, k: int) -> np.ndarray:
    """q^{⊗k} as an array of shape (V,)*k."""
    draft = np.asarray(draft, dtype=np.float64)
    _check_size(draft.size, k)
    joint = np.ones(())
    for _ in range(int(k)):
        joint = np.multiply.outer(joint, draft)
    return joint


def without_replacement_joint(draft: np.ndarray, k: int) -> np.ndarray:
    """Law of k ordered draws without replacement from q, shape (V,)*k (requires k distinct
    tokens in the support of q)."""
    draft = np.asarray(draft, dtype=np.float64)
    _check_size(draft.size, k)
    if np.count_nonzero(draft) < k:
        raise ConfigError(f"q has fewer than k = {k} tokens in its support; k draws without replacement do not exist")
    grids = np.indices((draft.size,) * int(k))
    joint = np.ones((draft.size,) * int(k))
    used = np.zeros_like(joint)
    for j in range(int(k)):
        joint *= draft[grids[j]] / np.maximum(1.0 - used, 1e-300)
        used = used + draft[grids[j]]
        for i in range(j):
            joint[grids[i] == grids[j]] = 0.0
    return joint


def _check_size(vocab: int, k: int) -> None:
    if vocab ** int(k) > MAX_TUPLES:
        raise ConfigError(f"OTM is an exponential reference; use V^K <= {MAX_TUPLES} (got V = {vocab}, K = {k}: {vocab ** int(k)} tuples)")


def otm_iid_acceptance_closed_form(target: np.ndarray, draft: np.ndarray, k: int) -> float:
    """alpha* = min_{A ⊆ V} p(A) + 1 - q(A)^k for k i.i.d. drafts (§10); V <= 12."""
    target = np.asarray(target, dtype=np.float64)
    draft = np.asarray(draft, dtype=np.float64)
    vocab = target.size
    if vocab > MAX_CLOSED_FORM_VOCAB:
        raise ConfigError(f"the OTM min-cut enumerates 2^V subsets; use V <= {MAX_CLOSED_FORM_VOCAB} (got V = {vocab})")
    subsets = (np.arange(2**vocab)[:, None] >> np.arange(vocab)[None, :]) & 1
    return float(np.min(subsets @ target + 1.0 - (subsets @ draft) ** int(k)))


class OTMPlanCache:
    """A bounded LRU of OTM plans keyed by the node's (p, q, k), owned by the caller that passes it
    to ``OTM(plan_cache=...)``, e.g. an exact enumeration that re-verifies the same nodes
    thousands of times. Holds no more than ``max_plans`` plans."""

    def __init__(self, max_plans: int = 4096) -> None:
        if max_plans < 1:
            raise ConfigError(f"an OTM plan cache needs max_plans >= 1, got {max_plans}")
        self.max_plans = max_plans
        self._plans: OrderedDict = OrderedDict()

    def __len__(self) -> int:
        return len(self._plans)

    def get_or_solve(self, target: np.ndarray, draft: np.ndarray, k: int) -> "OTMPlan":
        key = (target.tobytes(), draft.tobytes(), int(k))
        plan = self._plans.get(key)
        if plan is None:
            plan = otm_plan(target, iid_joint(draft, k))
            self._plans[key] = plan
            if len(self._plans) > self.max_plans:
                self._plans.popitem(last=False)
        else:
            self._plans.move_to_end(key)
        return plan


class OTM(Verifier):
    """Per-position OTM (§10) top-down over K i.i.d. paths; exponential reference (V^K <= 20,000).

    No state is carried between calls by default: plans are cached for one ``verify`` call only
    (the registry's shared instance must not grow a process-wide cache, DESIGN.md §6). A caller
    that verifies the same nodes many times passes its own ``OTMPlanCache``, whose lifetime it
    controls (the exact tests do: each node's LP is then solved once per enumeration).
    """

    name = "otm"
    section = "§10"
    lossless = True
    supported_schemes = frozenset({DraftScheme.CHAIN, DraftScheme.IID_PATHS})

    def __init__(self, plan_cache: OTMPlanCache | None = None) -> None:
        self.plan_cache = plan_cache

    def _verify(self, tree: DraftTree, rng: Rng) -> VerifyResult:
        cache = self.plan_cache if self.plan_cache is not None else OTMPlanCache(max(tree.num_nodes, 1))

        def node_rule(rng: Rng, target: np.ndarray, draft: np.ndarray, tokens: Sequence[int]):
            return otm_step(rng, cache.get_or_solve(target, draft, len(tokens)), tokens)

        return top_down(tree, rng, node_rule, raw_paths=True)


def otm_step(rng: Rng, plan: OTMPlan, drafted: Sequence[int]) -> tuple[int | None, np.ndarray | None, int]:
    """One OTM decision for the drafted tuple x: (index in ``drafted`` of the accepted token,
    None, 0), or (None, p_res, guard) when rejected; a single categorical draw over
    {accept y for each distinct y in x} ∪ {reject}."""
    tokens, probs = plan.accept_probs(drafted)
    reject = max(0.0, 1.0 - float(probs.sum()))
    choice = rng.categorical(np.append(probs, reject) / (probs.sum() + reject))
    if choice < len(tokens):
        return list(int(t) for t in drafted).index(int(tokens[choice])), None, 0
    residual = plan.residual
    if residual is None:  # unreachable in exact arithmetic: reject has probability ~0
        return None, plan.target, 1
    return None, residual, 0
