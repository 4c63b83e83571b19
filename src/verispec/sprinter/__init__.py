"""SPRINTER (ALGORITHMS.md §11): a learned verifier decides which drafted tokens are kept without
calling the target. LOSSY by design; with FPR beta the token law is (1 - beta) p + beta q.

features  what the verifier sees (n-gram draft: token features; neural draft: hidden state + token)
collect   training data from four prefix kinds, labels q(x)/p(x) <= gamma
train     linear / one-hidden-layer verifier, BCE + Adam + early stopping, ROC/AUC, verifier file
decoder   ``SprinterDecoder``: the decoding loop with a lazily refreshed target KV cache
evaluate  exact laws (Thm 3.1 / 3.3 / A.4), TV on a real pair, speed and ROUGE against SD
"""

from verispec.sprinter.decoder import DEFAULT_MAX_RUN, FeatureVerifier, SprinterDecoder, SprinterOutput

__all__ = ["DEFAULT_MAX_RUN", "FeatureVerifier", "SprinterDecoder", "SprinterOutput"]
