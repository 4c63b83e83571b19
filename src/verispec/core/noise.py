"""Counter-based Gumbel noise keyed by (seed, absolute position): drafter-invariant sampling.

With a seed, the target's token at absolute position t (its index in prompt + generated text) is
the Gumbel-max draw

    y_t = argmax_x  log p(x | y_<t) + G(seed, t, x)

over the support of the PROCESSED row p (temperature, top-k, top-p applied first; T = 0 is the
argmax and reads no noise). The G(seed, t, x) are i.i.d. standard Gumbel, so y_t ~ p exactly
(Gumbel-max trick), and they are a pure function of (seed, t, x): no draw depends on how many
random numbers earlier rounds used, on the draft, on the tree or on the timing. Every rule that
draws the target's tokens this way (plain sampling, the q-free walk, the Gumbel-coupled chain of
``verify.gumbel``) therefore emits the same text for the same seed.

Stream layout (numpy's Philox4x64-10, a counter-based block cipher):
  key      = seed (the 128-bit key (seed, 0); seeds are ints in [0, 2**63))
  counter  = (block, t, 0, 0): word 1 holds the position, word 0 the block within it
  words    = ``Philox(key=seed, counter=(0, t, 0, 0)).random_raw(V)``: the uint64 words of blocks
             0, 1, ... of position t, four per block; word x belongs to token x
  uniform  u(t, x) = ((word >> 11) + 0.5) / 2**53, in the open interval (0, 1)
  Gumbel   G(seed, t, x) = -log(-log(u(t, x)))
The draw is computed as the equivalent exponential race argmax_x p(x) / E(t, x), with
E = -log u ~ Exp(1) (log p + G = log p - log E): one logarithm per token and position, cached per
position, instead of three per token and node.
Positions never share a block (word 0 would have to run past 2**64 blocks), and token x's
number does not depend on V (a longer vocabulary only appends words).

``SeededDraws`` is what a decoder built with ``seed=`` uses: a ``SeededRng(seed)`` for the rules
that need their own randomness (sd, bv, spectr, ...: exact in law, not drafter-invariant) that
also carries the seed's ``GumbelNoise`` for the drafter-invariant draws.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from verispec.core.rng import SeededRng
from verispec.core.seeds import check_seed
from verispec.errors import ConfigError

# positions whose words stay cached: a round reads the draft's positions, then the target's
# (the same ones), so a round of depth <= 64 never regenerates a position
CACHED_POSITIONS = 66
_UNIFORM_SCALE = 2.0**-53


class GumbelNoise:
    """G(seed, t, x) for every token x, position by position (see the module docstring)."""

    def __init__(self, seed: int):
        self.seed = check_seed(seed)
        self._exponentials: OrderedDict[int, np.ndarray] = OrderedDict()

    @staticmethod
    def words(seed: int, position: int, size: int) -> np.ndarray:
        """The first ``size`` uint64 words of position ``position`` (the stream layout above)."""
        if position < 0:
            raise ConfigError(f"noise position must be >= 0, got {position}")
        return np.random.Philox(key=seed, counter=[0, position, 0, 0]).random_raw(size)

    def exponentials(self, position: int, ids: np.ndarray) -> np.ndarray:
        """E(seed, position, ids) = -log u (float64, shape of ids), cached per position."""
        ids = np.asarray(ids, dtype=np.int64)
        if not ids.size:
            return np.zeros(ids.shape)
        return self.leading(position, int(ids.max()) + 1)[ids]

    def leading(self, position: int, size: int) -> np.ndarray:
        """E(seed, position, x) for x = 0..size-1 (float64, size,): a read-only view of the cache,
        so a row over the whole vocabulary reads its noise without a gather."""
        cached = self._exponentials.get(position)
        if cached is None or len(cached) < size:
            cached = self._generate(position, size)
            self._exponentials[position] = cached
            if len(self._exponentials) > CACHED_POSITIONS:
                self._exponentials.popitem(last=False)
        else:
            self._exponentials.move_to_end(position)
        return cached[:size]

    def _generate(self, position: int, size: int) -> np.ndarray:
        """-log u(position, x) for x < size, in place in one float64 buffer (the values of the
        stream layout above, bit for bit: the same words, the same roundings)."""
        values = (self.words(self.seed, position, size) >> np.uint64(11)).astype(np.float64)
        values += 0.5
        values *= _UNIFORM_SCALE
        np.log(values, out=values)
        np.negative(values, out=values)
        values.flags.writeable = False  # handed out as views: nobody may change the noise
        return values

    def gumbel(self, position: int, ids: np.ndarray) -> np.ndarray:
        """G(seed, position, ids) = -log E (float64, shape of ids)."""
        return -np.log(self.exponentials(position, ids))


def gumbel_max(ids: np.ndarray, probs: np.ndarray, noise: GumbelNoise, position: int) -> int:
    """argmax over ids of log probs + G(position, ids) (the token id), computed as the race
    argmax probs / E. Zero entries never win; exact ties (probability 0 under continuous noise)
    go to the lowest listed id."""
    ids = np.asarray(ids, dtype=np.int64)
    probs = np.asarray(probs, dtype=np.float64)
    if len(ids) == 1 and probs[0] > 0:  # a point mass (e.g. greedy): no noise read
        return int(ids[0])
    if _is_leading_range(ids):  # the whole vocabulary (an untruncated row): the cache itself, no gather
        scores = probs / noise.leading(position, len(ids))
    else:
        scores = probs / noise.exponentials(position, ids)
    best = int(np.argmax(scores)) if len(ids) else 0
    if not len(ids) or not scores[best] > 0:  # zero entries score 0: the max is 0 only for an all-zero row
        raise ConfigError("gumbel_max needs a row with positive mass; the row given is all zero")
    return int(ids[best])


def _is_leading_range(ids: np.ndarray) -> bool:
    """ids == 0, 1, ..., len(ids) - 1 (what ``Rows.support`` gives for an untruncated row); checked
    at both ends first, so a truncated support costs two reads, a full one a pass over V."""
    size = len(ids)
    return size > 1 and ids[0] == 0 and ids[-1] == size - 1 and bool((np.diff(ids) == 1).all())


def gumbel_argmax(rows, node: int, noise: GumbelNoise, position: int) -> int:
    """The Gumbel-max draw of the processed row ``rows`` (a ``core.rows.Rows``) at ``node`` for
    the token at absolute ``position``: argmax over the row's support of log p + G. Greedy rows
    give their argmax (lowest id on ties, as plain greedy decoding)."""
    if rows.greedy:
        return rows.argmax(node)
    ids, probs = rows.support(node)
    return gumbel_max(ids, probs, noise, position)


@dataclass(frozen=True)
class NoiseAt:
    """The seed's noise for one round: the root's next token sits at absolute ``position``, so a
    node at depth d draws the token at ``position + d``. A verifier given a ``NoiseAt`` instead of
    an ``Rng`` draws the target's tokens from it (drafter-invariant)."""

    noise: GumbelNoise
    position: int

    def draw(self, rows, node: int, depth: int) -> int:
        return gumbel_argmax(rows, node, self.noise, self.position + depth)


class SeededDraws(SeededRng):
    """``SeededRng(seed)`` (for the rules with their own randomness) that also carries the seed's
    ``GumbelNoise`` (for the drafter-invariant ones): what a decoder uses when given only a seed."""

    def __init__(self, seed: int):
        super().__init__(check_seed(seed))
        self.noise = GumbelNoise(seed)


def noise_of(rng) -> GumbelNoise | None:
    """The Gumbel noise an Rng carries (``SeededDraws``), or None (a plain Rng: exact in law only)."""
    return getattr(rng, "noise", None)
