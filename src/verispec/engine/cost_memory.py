"""The cost curve a process learned, kept on disk for the next process on the same machine.

The online cost model (``engine.cost_model``) starts every process from a prior curve: the shipped
one, measured once on one CPU, or a backend's own (``cost_prior``). A fresh ``verispec generate``
then sizes its first rounds for that CPU while its buckets fill, and a 100-token answer is over
after ~40 rounds. ``CostMemory`` keeps what the model learned, the target forward's cost relative to
one token at the top of every size bucket it read ({2: cost, 4: cost, 8: ...}), in a small JSON
file keyed by what the costs depend on (the target adapter's ``cost_signature()``: CPU, torch or
llama.cpp, dtype, threads, model shapes); the next process starts from that curve instead (buckets
no process read scaled from their neighbours, as the online model does), and keeps learning.

Replayed on the rounds of 76 tuning prompts (bf16 and fp32, Zen 5, a fresh decoder per prompt, each
starting from the curve the previous prompt learned), the tree sizes came 0.2-0.8 points closer
to the hindsight oracle than from the shipped prior (docs/adaptive-speculation.md).

Only the target forward's curve is kept; the drafting and verification overheads depend on the
draft and the rule, and the model learns them in a few rounds. A damaged or foreign file is
ignored (and replaced at the next save). Saving merges: sizes this process did not read keep
their remembered cost. Nothing here reads a round's random draws, so every rule stays exact, and
the drafter-invariant rules give the same text whatever the file holds.

Location: ``$VERISPEC_COST_CACHE``, else ``<cache root>/cost-curves`` ($VERISPEC_CACHE or
~/.cache/verispec), one file per signature.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import time
import warnings
from pathlib import Path

from verispec.draft.tree_policy import DEFAULT_COST_POINTS, CostCurve
from verispec.engine.cost_model import OnlineCostModel, fill_unobserved, size_bucket
from verispec.errors import ConfigError

FORMAT_VERSION = 2
# a kept point weighs at most this many readings (three processes' full windows), so that a machine
# whose curve changed (another torch, a BIOS setting) is followed within a few processes
MAX_WEIGHT = 27.0
MAX_TOKENS = 4096  # the largest round a remembered curve covers (OnlineCostModel's max_tokens)


def cost_cache_dir() -> Path:
    """Where remembered cost curves are kept: $VERISPEC_COST_CACHE, else <cache root>/cost-curves."""
    from verispec.models.loading import cache_root

    chosen = os.environ.get("VERISPEC_COST_CACHE")
    return Path(chosen).expanduser() if chosen else cache_root() / "cost-curves"


class CostMemory:
    """One remembered cost curve (a JSON file): ``prior_points`` reads it, ``remember`` merges a
    model's learned points into it. ``min_interval`` seconds between two writes (a server's decoder
    remembers after every request; a CLI process writes once)."""

    def __init__(self, path: str | os.PathLike, min_interval: float = 30.0):
        self.path = Path(path).expanduser()
        if self.path.is_dir():
            raise ConfigError(f"cost_cache {str(self.path)!r} is a directory; give a file name, e.g. "
                              f"{str(self.path / 'cost.json')!r}, or True for the default location")
        self.min_interval = float(min_interval)
        self._last_write: float | None = None

    @classmethod
    def for_target(cls, target, min_interval: float = 30.0) -> CostMemory:
        """The file of ``target``'s signature in ``cost_cache_dir()``; a target adapter without
        ``cost_signature`` (a toy model, a custom adapter) needs an explicit file."""
        signature = getattr(target, "cost_signature", None)
        if signature is None:
            raise ConfigError(
                f"cost_cache=True needs a target that describes its costs (cost_signature()); {type(target).__name__} "
                "does not: pass a file path as cost_cache, or leave it off"
            )
        digest = hashlib.sha256(f"v{FORMAT_VERSION}\n{signature()}".encode()).hexdigest()[:24]
        return cls(cost_cache_dir() / f"{digest}.json", min_interval)

    @classmethod
    def from_setting(cls, cost_cache, target) -> CostMemory | None:
        """A decoder's ``cost_cache`` setting: True (``for_target``), a file path, or False / None (off)."""
        if cost_cache is False or cost_cache is None:
            return None
        if cost_cache is True:
            return cls.for_target(target)
        if isinstance(cost_cache, (str, os.PathLike)):
            return cls(cost_cache)
        raise ConfigError(f"cost_cache must be True, False or a file path, got {cost_cache!r}")

    # ----- reading ----------------------------------------------------------------------------
    def records(self) -> dict[int, tuple[float, float]]:
        """The remembered {n: (cost relative to one token, weight in readings)}, one per size
        bucket (n = 2, 4, 8, ...); empty when there is no usable file."""
        try:
            record = json.loads(self.path.read_text())
            if record.get("version") != FORMAT_VERSION:
                return {}
            found = {int(n): (float(entry["cost"]), float(entry["weight"])) for n, entry in record["points"].items()}
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return {}
        for n, (cost, weight) in found.items():
            # one point per bucket, at its top (2, 4, 8, ...)
            if n < 2 or n & (n - 1) or not (math.isfinite(cost) and cost > 0 and math.isfinite(weight) and weight > 0):
                return {}
        return found

    def points(self) -> dict[int, float]:
        """The remembered {n: cost relative to one token}; empty when there is no usable file."""
        return {n: cost for n, (cost, _) in self.records().items()}

    def prior_points(self, fallback=None) -> tuple[tuple[int, float], ...] | None:
        """The remembered curve as ``OnlineCostModel(prior_points=...)``, or ``fallback`` (None: the
        shipped curve) when nothing is remembered. A point at the top of every size bucket: the
        remembered ones, and for the buckets no process read, ``fallback``'s cost scaled as the
        online model scales an unread bucket (``fill_unobserved``: the log ratio to ``fallback``
        interpolated between remembered neighbours, constant beyond them), never a slope
        extrapolated from two small sizes."""
        points = self.points()
        if not points:
            return fallback
        curve = CostCurve(DEFAULT_COST_POINTS if fallback is None else tuple(fallback), overhead=0.0)
        tops = [2 ** bucket for bucket in range(1, size_bucket(MAX_TOKENS) + 1)]
        ratios = fill_unobserved([math.log(points[n] / curve(n)) if n in points else None for n in tops])
        return ((1, 1.0), *((n, curve(n) * math.exp(ratio)) for n, ratio in zip(tops, ratios)))

    def cost_model(self, fallback=None) -> OnlineCostModel:
        """A fresh online cost model starting from the remembered curve (else from ``fallback``)."""
        return OnlineCostModel(prior_points=self.prior_points(fallback))

    # ----- writing ----------------------------------------------------------------------------
    def remember(self, model: OnlineCostModel, force: bool = False) -> bool:
        """Merge ``model.learned_points()`` into the file (atomically: a concurrent reader sees the old
        or the whole new file); nothing when the model read no speculative round, or when the last
        write was less than ``min_interval`` seconds ago (unless ``force``). True when written."""
        now = time.monotonic()
        if not force and self._last_write is not None and now - self._last_write < self.min_interval:
            return False
        learned = model.learned_points()
        if not learned:
            return False
        merged = self.records()
        for n, (cost, readings) in learned.items():
            kept_cost, kept_weight = merged.get(n, (cost, 0.0))
            kept_weight = min(kept_weight, MAX_WEIGHT)
            # log costs averaged by readings: one process's few readings of a bucket (mostly the
            # pooled ratio of its other sizes) move the kept point only a little
            log_cost = (kept_weight * math.log(kept_cost) + readings * math.log(cost)) / (kept_weight + readings)
            merged[n] = (math.exp(log_cost), min(kept_weight + readings, MAX_WEIGHT))
        record = {"version": FORMAT_VERSION,
                  "points": {str(n): {"cost": round(cost, 6), "weight": weight} for n, (cost, weight) in sorted(merged.items())}}
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            temporary = self.path.with_suffix(f".{os.getpid()}.{id(self)}.tmp")
            temporary.write_text(json.dumps(record))
            temporary.replace(self.path)
        except OSError as error:  # costs the next process its warm start, not this one's output
            warnings.warn(f"could not keep the learned cost curve in {str(self.path)!r} ({error.strerror}); set "
                          "VERISPEC_COST_CACHE to a writable directory, or turn the cost cache off", stacklevel=2)
            self._last_write = now  # one warning per interval, not one per request
            return False
        self._last_write = now
        return True
