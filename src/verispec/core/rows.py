"""Row providers: the target and draft distributions of a draft tree, one row per node, computed
only where a rule asks for them (DESIGN.md §3, ALGORITHMS.md §1 rules 1-2).

Why an interface and not arrays: a round scores n nodes over V tokens, and turning all n x V
logits into float64 probability vectors costs far more than the rules themselves at V = 128k (one
softmax over 33 x 128,256 floats takes ~16 ms at 1 thread). Most rules visit a few rows: SD stops
at the first rejection, NSS walks one path, and their acceptance tests read one entry per row. So
every rule is written ONCE against this interface, and two backends implement it:

``DenseRows``  wraps an (n, V) float64 array (what tests, enumeration and replay use, and what
               ``DraftTree.build(..., target_probs=array)`` makes);
``LogitRows``  keeps the raw (n, V) logits tensor on its device plus the ``SamplingParams`` and
               processes a row only when it is touched (the engine's path); its passes over V
               live in ``core.logit_kernels``.

The exactness tests enumerate the rules through both backends (tests/core/test_rows.py), so the
code the engine runs is the code that is proven exact.

Interface (``Rows``), n rows over V tokens, node = row index:
  prob(node, token) -> float            one entry of the processed row (float64)
  probs_of(nodes, tokens) -> (m,) f64   entries (nodes[i], tokens[i]), one batched gather
  row(node) -> (V,) float64             the full processed row (cached; callers must not write
                                        into it: copy first)
  argmax(node) -> int                   most probable token, lowest id on ties
  support(node) -> (ids, values)        the row's positive entries: ids ascending int64 (a superset
                                        of {x : row[x] > 0}; zeros may be listed), values float64
                                        equal to row(node)[ids] entry by entry. Every law a rule
                                        draws from at a node lies inside supp(p(.|node)), so rules
                                        compute residuals on these few entries (a top-p nucleus)
                                        instead of V
  gather(node, ids) -> (m,) float64     row(node)[ids] entry by entry, without building the row
                                        where the backend can (the draft side of a residual)
  greedy                                True when every row is a point mass at its argmax
                                        (temperature 0): rules then draw nothing from full rows
  dense() -> (n, V) float64             every row (for rules that need all of them)
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from verispec.core.logit_kernels import KERNELS, DeviceKernels, HostKernels, order_by_value_then_position
from verispec.core.rng import Rng
from verispec.errors import ConfigError, InvalidDistributionError


class Rows:
    """Base class of the row providers; see the module docstring for the interface."""

    num_rows: int
    vocab_size: int
    greedy: bool = False

    def row(self, node: int) -> np.ndarray:  # pragma: no cover - abstract
        raise NotImplementedError

    def prob(self, node: int, token: int) -> float:
        return float(self.probs_of([node], [token])[0])

    def probs_of(self, nodes: Sequence[int], tokens: Sequence[int]) -> np.ndarray:  # pragma: no cover
        raise NotImplementedError

    def argmax(self, node: int) -> int:
        return int(np.argmax(self.row(node)))

    def support(self, node: int) -> tuple[np.ndarray, np.ndarray]:
        """(ids ascending, row[ids]) over the positive entries; backends override with cheaper forms."""
        row = self.row(node)
        ids = np.flatnonzero(row > 0)
        return ids, row[ids]

    def gather(self, node: int, ids) -> np.ndarray:
        """row(node)[ids] (float64, a new array)."""
        return self.row(node)[np.asarray(ids, dtype=np.int64)]

    def dense(self) -> np.ndarray:
        return np.stack([self.row(node) for node in range(self.num_rows)]) if self.num_rows else np.zeros((0, self.vocab_size))

    def __len__(self) -> int:
        return self.num_rows


class DenseRows(Rows):
    """Rows of an (n, V) float64 array (the reference backend). greedy=True declares every row a
    point mass (one-hot), which lets rules skip drawing from it, as ``LogitRows`` does at T = 0."""

    def __init__(self, probs, greedy: bool = False):
        self.array = np.asarray(probs, dtype=np.float64)
        # a wrong shape is reported by DraftTree.validate, which names the argument
        shape = self.array.shape
        self.num_rows = int(shape[0]) if self.array.ndim else 0
        self.vocab_size = int(shape[-1]) if self.array.ndim else 0
        self.greedy = bool(greedy)

    def row(self, node: int) -> np.ndarray:
        return self.array[node]

    def prob(self, node: int, token: int) -> float:
        return float(self.array[node, token])

    def probs_of(self, nodes, tokens) -> np.ndarray:
        return self.array[np.asarray(nodes, dtype=np.int64), np.asarray(tokens, dtype=np.int64)]

    def gather(self, node: int, ids) -> np.ndarray:
        return self.array[int(node), np.asarray(ids, dtype=np.int64)]

    def dense(self) -> np.ndarray:
        return self.array


class NodeRows(Rows):
    """Rows held per node in a mapping node -> (V,) float64 row; nodes without a row (leaves of a
    draft: nothing was drawn from them) are all zero. The draft side of an engine round: the
    sampler already built the rows it drew from, and stacking them into an (n, V) matrix of
    mostly zero rows would copy n x V floats for nothing."""

    def __init__(self, rows: Mapping[int, np.ndarray], num_rows: int, vocab_size: int, greedy: bool = False):
        self.rows = {int(node): np.asarray(row, dtype=np.float64) for node, row in rows.items()}
        self.num_rows, self.vocab_size, self.greedy = int(num_rows), int(vocab_size), bool(greedy)
        self._zero: np.ndarray | None = None
        self._dense: np.ndarray | None = None
        self._support: dict[int, tuple[np.ndarray, np.ndarray]] = {}

    def row(self, node: int) -> np.ndarray:
        found = self.rows.get(int(node))
        if found is not None:
            return found
        if self._zero is None:
            self._zero = np.zeros(self.vocab_size)
        return self._zero

    def prob(self, node: int, token: int) -> float:
        found = self.rows.get(int(node))
        return 0.0 if found is None else float(found[token])

    def probs_of(self, nodes, tokens) -> np.ndarray:
        return np.array([self.prob(n, t) for n, t in zip(nodes, tokens)], dtype=np.float64)

    def support(self, node: int) -> tuple[np.ndarray, np.ndarray]:
        """The positive entries of the node's row (cached: one pass over V per node); a node
        without a row has an empty support."""
        node = int(node)
        cached = self._support.get(node)
        if cached is None:
            found = self.rows.get(node)
            if found is None:
                cached = (np.zeros(0, dtype=np.int64), np.zeros(0))
            else:
                ids = np.flatnonzero(found > 0)
                cached = (ids, found[ids])
            self._support[node] = cached
        return cached

    def gather(self, node: int, ids) -> np.ndarray:
        ids = np.asarray(ids, dtype=np.int64)
        found = self.rows.get(int(node))
        return np.zeros(ids.shape) if found is None else found[ids]

    def dense(self) -> np.ndarray:
        if self._dense is None:  # built once: rules that read every row ask for it repeatedly
            self._dense = super().dense()
        return self._dense


# p-thresholds of the top-p candidate passes over V, tried in turn; the last one, (1 - top_p) / (4 V),
# is appended per row (below it the rest provably holds less than 1 - top_p). Within the first
# pass the nucleus is sought among p > NUCLEUS_FIRST_EPSILON first (fewer tokens to sort).
NUCLEUS_PASS_EPSILONS = (3e-5, 1e-6)
NUCLEUS_FIRST_EPSILON = 1e-3
# slack of the crossing test, as core.sampling._top_p_mask: a nucleus whose mass equals top_p up
# to rounding is complete
TOP_P_SLACK = 1e-12


@dataclass(frozen=True)
class RowState:
    """What a touched row of ``LogitRows`` keeps (the entries follow from it and one logit each).

    shift     the row's max logit (float32): s(x) = float32((logit(x) - shift) / T), max s = 0
    log_norm  log of the kept mass of exp(s) (float64); p(x) = exp(float64(s(x)) - log_norm)
    kth       top-k cut on s: kept iff s >= kth (-inf without top-k)
    s_cut     top-p cut on s: kept iff s > s_cut, or s == s_cut and id <= id_cut (-inf without)
    id_cut    the id of the token that crosses top_p (ties at s_cut are kept up to it)
    support   (ids ascending int64, p at them float64) of a truncated row (top-k or top-p);
              None: every token with s > -inf is kept and the support is the whole vocabulary
    """

    shift: np.float32
    log_norm: float
    kth: float
    s_cut: float
    id_cut: int
    support: tuple[np.ndarray, np.ndarray] | None


class LogitRows(Rows):
    """Processed rows of raw logits, computed on demand (ALGORITHMS.md §1 rule 1; same semantics
    as ``core.sampling.logits_to_probs``, which builds every row densely).

    logits: (n, V) tensor, any float dtype, any device; params: ``SamplingParams``;
    kernels: where the passes over V run: "host" (NumPy on views of CPU logits), "device" (torch
    on the logits' device, batched over rows), "auto" (host for CPU tensors, else device).

    Every entry goes through ONE float32 expression, ``scaled``:
        s(x) = float32((logit(x) - shift) / T),   shift = the row's max logit, so max s = 0,
    computed in NumPy on the host from the float32 logit, whichever kernels found the row's
    cuts; then p(x) = exp(float64(s(x)) - log_norm) on kept tokens, 0 elsewhere. prob(),
    probs_of(), row(), support() and gather() all evaluate exactly this, so they agree bit for bit.

    Per touched row, the passes over V (batched over the rows asked for together):
      max      the shift (one pass);
      top-k    the k-th largest logit l_k (``torch.topk``); kept = {s >= s(l_k)} (ties at the k-th
               value kept, as logits_to_probs), found as {logit > L} for a float32 L checked to
               give s(L) < s(l_k), then filtered on s, so no token that rounding merges with the
               cut is lost; the kept mass is summed in float64 over the kept tokens;
      mass     without top-k, Z = sum_x exp(s(x)) over V. With top-p: float32 terms
               exp2((logit - shift) * log2(e)/T) (torch's exp2 costs half its exp on CPU) and
               float32 accumulation; without truncation: exp of the float32 s itself (the
               entries' s) with float64 accumulation, because there Z is the row's normaliser;
      top-p    candidates C = {s > S}: tokens of p > eps found by one comparison of the LOGITS with
               a float32 threshold L (s is non-decreasing in the logit, so {logit > L} holds C and
               filtering on s(x) > S = s(L) gives C exactly). C is an upper set of the order
               (s desc, id asc), so once its mass reaches top_p the nucleus lies in it, ties at the
               cut included; only C is sorted (one sort of (s, id) packed into int64 keys: ties by
               id, exactly ``core.sampling._top_p_mask``). Passes at eps = 3e-5 (trying the
               subset p > 1e-3 first), 1e-6, (1 - top_p)/(4V), then every token (reached only
               through rounding).
    The kept set of a truncated row is stored as its support (ids ascending, their p), so
    support(), row() (a scatter into zeros) and the rules' residuals never touch the other V
    entries. Without truncation the support is every token and row() is one float64 pass.

    Precision: everything a rule divides or compares is float64 (ALGORITHMS.md §1 rule 2): the
    entries, log_norm, the cumulative masses that place the top-p cut. A truncated row is
    normalised by its kept mass summed in float64 (rows sum to 1 within ~1e-15); the float32 mass
    over V only places the top-p cut, which it moves by at most its relative error (~1e-7
    typically, ~2e-6 for a few dominant tokens over a long flat tail, where float32 accumulation
    is worst: the same order as logits_to_probs's float32 softmax, and what separates the two is
    tokens at the cut holding that little mass). An untruncated row's normaliser sums exp of the
    entries' own s in float64, so its entries sum to 1 within float32 exp's rounding (~1e-7),
    inside the 1e-6 every probability vector is checked against.

    Greedy (T = 0): rows are point masses at the argmax (lowest id on ties, as logits_to_probs),
    read on a view of the logits (no copy); prob() compares with the argmax and no one-hot vector
    is built unless row() is called. NaN, +inf or all -inf logits raise InvalidDistributionError
    when their row is touched.
    """

    def __init__(self, logits: torch.Tensor, params, kernels: str = "auto"):
        if logits.ndim != 2:
            raise InvalidDistributionError(f"logits must be an (n, V) tensor, got shape {tuple(logits.shape)}")
        if kernels not in KERNELS:
            raise ConfigError(f"kernels must be one of {KERNELS}, got {kernels!r}")
        self.logits = logits.detach()
        on_cpu = self.logits.device.type == "cpu"
        if kernels == "host" and not on_cpu:
            raise ConfigError(f"kernels='host' needs CPU logits, got device {self.logits.device}; use 'device' or 'auto'")
        use_host = kernels == "host" or (kernels == "auto" and on_cpu)
        self._kernels = HostKernels(self.logits) if use_host else DeviceKernels(self.logits)
        self.params = params
        self.num_rows, self.vocab_size = (int(s) for s in logits.shape)
        self.greedy = params.greedy
        self._temperature = np.float32(params.temperature)
        self._argmax: dict[int, int] = {}
        self._state: dict[int, RowState] = {}
        self._rows: dict[int, np.ndarray] = {}
        self._dense: np.ndarray | None = None

    # ----- the one expression of an entry -------------------------------------------------------
    def scaled(self, logits, shifts) -> np.ndarray:
        """s = float32((logit - shift) / T) elementwise (NumPy float32; shapes broadcast)."""
        return (np.asarray(logits, dtype=np.float32) - np.asarray(shifts, dtype=np.float32)) / self._temperature

    # ----- per-row preparation (batched over the rows asked for) ---------------------------------
    def _check_rows(self, values: np.ndarray, nodes: Sequence[int]) -> None:
        finite = np.isfinite(values)
        if not finite.all():
            bad = nodes[int(np.flatnonzero(~finite)[0])]
            raise InvalidDistributionError(
                f"row {bad} of the logits holds NaN, +inf or only -inf; check the model weights and "
                "dtype (fp16 can overflow: try bf16 or fp32)"
            )

    def _prepare_argmax(self, nodes: Sequence[int]) -> None:
        missing = [n for n in dict.fromkeys(int(n) for n in nodes) if n not in self._argmax]
        if not missing:
            return
        ids, values = self._kernels.argmax(missing)
        self._check_rows(values, missing)
        self._argmax.update(zip(missing, (int(i) for i in ids)))

    def _prepare(self, nodes: Sequence[int]) -> None:
        missing = [n for n in dict.fromkeys(int(n) for n in nodes) if n not in self._state]
        if not missing:
            return
        maxima = self._kernels.maxima(missing)
        self._check_rows(maxima, missing)
        top_k, top_p = self.params.top_k, self.params.top_p
        if top_k and top_k < self.vocab_size:
            self._prepare_top_k(missing, maxima, top_k)
            return
        # top-p renormalises over the nucleus in float64: the mass over V only places the cut
        log_z = np.log(self._kernels.masses(missing, maxima, self.params.temperature, exact_terms=top_p == 1.0))
        if top_p < 1.0:
            self._prepare_nucleus(missing, maxima, log_z)
            return
        for i, node in enumerate(missing):
            self._state[node] = RowState(maxima[i], float(log_z[i]), -math.inf, -math.inf, self.vocab_size, None)

    def _threshold_below(self, value: np.float32, shift: np.float32) -> np.float32:
        """A float32 logit L < value with scaled(L) < scaled(value): {logit > L} then holds every
        token whose s reaches s(value), even where rounding merged neighbouring logits."""
        target = self.scaled(value, shift)
        step = max(abs(float(value) - float(shift)) * 2.0**-20, 1e-30)
        while True:
            candidate = np.float32(float(value) - step)
            if candidate >= value:
                candidate = np.nextafter(value, np.float32(-np.inf))
            if self.scaled(candidate, shift) < target:
                return candidate
            step *= 2.0

    def _prepare_top_k(self, nodes: list[int], maxima: np.ndarray, top_k: int) -> None:
        kth_logits = self._kernels.kth_largest(nodes, top_k)
        thresholds = np.array([
            -np.inf if kth == -np.inf else self._threshold_below(kth, shift) for kth, shift in zip(kth_logits, maxima)
        ], dtype=np.float32)
        found = self._kernels.above(nodes, thresholds)
        for i, (node, (ids, logits)) in enumerate(zip(nodes, found)):
            kth = self.scaled(kth_logits[i], maxima[i])
            scaled = self.scaled(logits, maxima[i])
            keep = scaled >= kth
            if kth == -np.inf:  # fewer than k finite logits: every token is kept, -inf ones at p = 0
                ids, scaled = np.arange(self.vocab_size), self.scaled(self._kernels.full_row(node), maxima[i])
                keep = np.ones(self.vocab_size, dtype=bool)
            ids, scaled = ids[keep], scaled[keep]
            log_z = float(np.log(np.sum(np.exp(scaled.astype(np.float64)))))  # max s = 0 is kept: sum >= 1
            if self.params.top_p < 1.0:
                self._state[node] = self._nucleus(ids, scaled, log_z, maxima[i], float(kth), final=True)
            else:
                with np.errstate(under="ignore"):
                    values = np.exp(scaled.astype(np.float64) - log_z)
                self._state[node] = RowState(maxima[i], log_z, float(kth), -math.inf, self.vocab_size, (ids, values))

    def _prepare_nucleus(self, nodes: list[int], maxima: np.ndarray, log_z: np.ndarray) -> None:
        """Top-p without top-k: one comparison pass over V per row at p > 3e-5 (then 1e-6, then
        (1 - top_p)/(4V), below which the rest provably holds less than 1 - top_p; then every
        token, reached only through rounding). Inside a pass the nucleus is first sought among the
        candidates of p > 1e-3 (an exact s-threshold on the host), so a peaked row sorts a few
        dozen tokens, not hundreds."""
        top_p = self.params.top_p
        temperature = self.params.temperature
        last = (1.0 - top_p) / (4.0 * self.vocab_size)
        passes = [*(e for e in NUCLEUS_PASS_EPSILONS if e > last), last]
        pending = list(range(len(nodes)))
        for pass_index, eps in enumerate(passes):
            if not pending:
                return
            # p > eps  <=>  s > log_z + log(eps)  <=  logit > max + T (log_z + log eps)
            thresholds = np.array([float(maxima[i]) + temperature * (float(log_z[i]) + math.log(eps)) for i in pending],
                                  dtype=np.float32)
            found = self._kernels.above([nodes[i] for i in pending], thresholds)
            still = []
            for i, threshold, (ids, logits) in zip(pending, thresholds, found):
                scaled = self.scaled(logits, maxima[i])
                keep = scaled > self.scaled(threshold, maxima[i])  # C = {s > s(L)} exactly
                ids, scaled = ids[keep], scaled[keep]
                state = None
                if pass_index == 0:  # the upper set {p > 1e-3} of C first: enough for peaked rows
                    first = scaled > float(log_z[i]) + math.log(NUCLEUS_FIRST_EPSILON)
                    if first.sum() < len(scaled):
                        state = self._nucleus(ids[first], scaled[first], float(log_z[i]), maxima[i], -math.inf, final=False)
                if state is None:
                    state = self._nucleus(ids, scaled, float(log_z[i]), maxima[i], -math.inf, final=False)
                if state is None:
                    still.append(i)
                else:
                    self._state[nodes[i]] = state
            pending = still
        for i in pending:  # only through rounding: every token
            scaled = self.scaled(self._kernels.full_row(nodes[i]), maxima[i])
            self._state[nodes[i]] = self._nucleus(np.arange(self.vocab_size), scaled, float(log_z[i]), maxima[i],
                                                  -math.inf, final=True)

    def _nucleus(self, ids: np.ndarray, scaled: np.ndarray, log_z: float, shift: np.float32, kth: float,
                 final: bool) -> RowState | None:
        """The top-p cut inside candidates (ids ascending, their s; an upper set of the order
        (s desc, id asc)): the most probable in that order until their mass, exp(s - log_z) summed
        in float64, reaches top_p. None when the candidates' mass falls short (unless ``final``:
        then all of them); that is seen before sorting anything."""
        if not len(ids):
            return None
        threshold = self.params.top_p - TOP_P_SLACK
        with np.errstate(under="ignore"):
            weights = np.exp(scaled.astype(np.float64) - log_z)
            if not final and weights.sum() < threshold:
                return None
            order = order_by_value_then_position(scaled)
            cumulative = np.cumsum(weights[order])
            crossing = int(np.searchsorted(cumulative, threshold))
            if crossing >= len(ids):
                if not final:
                    return None
                crossing = len(ids) - 1
            log_norm = log_z + math.log(float(cumulative[crossing]))
            kept = np.sort(order[: crossing + 1])  # positions ascending: ids ascending
            values = np.exp(scaled[kept].astype(np.float64) - log_norm)
        cut = order[crossing]
        return RowState(shift, log_norm, kth, float(scaled[cut]), int(ids[cut]), (ids[kept], values))

    # ----- the interface ------------------------------------------------------------------------
    def _entries(self, nodes: np.ndarray, tokens: np.ndarray) -> np.ndarray:
        """p at (nodes[i], tokens[i]) from one logit each (rows prepared)."""
        states = [self._state[int(n)] for n in nodes]
        shifts = np.array([s.shift for s in states], dtype=np.float32)
        scaled = self.scaled(self._kernels.entries(nodes, tokens), shifts)
        log_norm = np.array([s.log_norm for s in states])
        kth = np.array([s.kth for s in states])
        s_cut = np.array([s.s_cut for s in states])
        id_cut = np.array([s.id_cut for s in states])
        kept = (scaled >= kth) & ((scaled > s_cut) | ((scaled == s_cut) & (tokens <= id_cut)))
        with np.errstate(under="ignore"):
            values = np.exp(scaled.astype(np.float64) - log_norm)
        return np.where(kept, values, 0.0)

    def argmax(self, node: int) -> int:
        if self.greedy:
            self._prepare_argmax([node])
            return self._argmax[int(node)]
        ids, values = self.support(node)
        return int(ids[np.argmax(values)])  # ids ascending: the lowest id among the maxima

    def probs_of(self, nodes, tokens) -> np.ndarray:
        nodes = np.asarray([int(n) for n in nodes], dtype=np.int64)
        tokens = np.asarray([int(t) for t in tokens], dtype=np.int64)
        if not len(nodes):
            return np.zeros(0)
        if self.greedy:
            self._prepare_argmax(nodes.tolist())
            return np.array([1.0 if self._argmax[int(n)] == t else 0.0 for n, t in zip(nodes, tokens)])
        self._prepare(nodes.tolist())
        return self._entries(nodes, tokens)

    def gather(self, node: int, ids) -> np.ndarray:
        """row(node)[ids] from the logits at ids only (the expression of probs_of)."""
        ids = np.asarray(ids, dtype=np.int64)
        if self.greedy:
            return (ids == self.argmax(node)).astype(np.float64)
        if not ids.size:
            return np.zeros(ids.shape)
        self._prepare([node])
        return self._entries(np.full(ids.shape, int(node), dtype=np.int64), ids)

    def support(self, node: int) -> tuple[np.ndarray, np.ndarray]:
        """Truncated rows: the kept ids ascending with their p (no dense row); greedy rows:
        ([argmax], [1.0]); untruncated rows: every id and row(node) itself. Cached: callers must
        not write into the arrays."""
        node = int(node)
        if self.greedy:
            return np.array([self.argmax(node)], dtype=np.int64), np.ones(1)
        self._prepare([node])
        support = self._state[node].support
        if support is not None:
            return support
        return np.arange(self.vocab_size), self.row(node)

    def dense(self) -> np.ndarray:
        """Every row, (n, V) float64: one batched preparation, then the rows (for the rules that
        read all of them, and for modification windows)."""
        if self._dense is None:
            if self.num_rows and not self.greedy:
                self._prepare(range(self.num_rows))
            self._dense = super().dense()
        return self._dense

    def row(self, node: int) -> np.ndarray:
        node = int(node)
        cached = self._rows.get(node)
        if cached is not None:
            return cached
        if self.greedy:
            result = np.zeros(self.vocab_size)
            result[self.argmax(node)] = 1.0
        else:
            self._prepare([node])
            state = self._state[node]
            if state.support is not None:  # truncated: the kept entries into zeros
                result = np.zeros(self.vocab_size)
                ids, values = state.support
                result[ids] = values
            else:  # every token kept (s = -inf gives exactly 0): one float64 pass
                scaled = self.scaled(self._kernels.full_row(node), state.shift)
                with np.errstate(under="ignore"):
                    result = np.exp(scaled.astype(np.float64) - state.log_norm)
        self._rows[node] = result
        return result


def as_rows(value, greedy: bool = False) -> Rows:
    """A ``Rows`` as is; an (n, V) array or list of rows as ``DenseRows``."""
    if isinstance(value, Rows):
        return value
    return DenseRows(value, greedy=greedy)


def draw_from(rng: Rng, target: Rows, node: int, build=None) -> tuple[int, int]:
    """Draw the extra token at ``node``: from ``build()`` -> (law (V,), guard hits), or from the
    target row p(.|node) when ``build`` is None. Returns (token, guard hits).

    Every law a rule draws from at a node (the target row, a residual norm([w p - q]_+) or its
    guard fallback p, NSS's miss law, RRS's t_m, SpecHub's r, traversal's updated P_u) is
    supported inside the support of p(.|node). When the target rows are point masses (greedy)
    that support is {argmax p}, so the draw is that token: no law is built, and no random number
    is used (a draw from a one-point law has no alternative, so the output law is unchanged)."""
    if target.greedy:
        return target.argmax(node), 0
    if build is None:
        return rng.categorical(target.row(node)), 0
    law, guard = build()
    return rng.categorical(law), int(guard)


def draw_on_support(rng: Rng, target: Rows, node: int, build=None) -> tuple[int, int]:
    """``draw_from`` in the coordinates of the target's support at ``node``.

    ids, p = target.support(node); ``build(ids, p)`` -> (law over ids (m,), guard hits), e.g.
    ``residual(p, draft.gather(node, ids))``; the token drawn is ids[categorical(law)]. Without
    ``build`` the draw is from p itself. Exact whenever the law vanishes outside supp(p), which
    holds for every law of the rules (see ``draw_from``): the entries outside the support are 0 in
    the dense law, so a categorical over the support has the same law, and with the same uniform
    the same token (the cumulative sums agree; only the normaliser's summation order differs, by
    rounding). Greedy rows draw nothing (their argmax), as in ``draw_from``."""
    if target.greedy:
        return target.argmax(node), 0
    ids, probs = target.support(node)
    if build is None:
        return int(ids[rng.categorical(probs)]), 0
    law, guard = build(ids, probs)
    return int(ids[rng.categorical(law)]), int(guard)
