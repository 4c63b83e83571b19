"""Training SPRINTER's verifier (ALGORITHMS.md §11 "Training"): a linear layer + sigmoid (or one
hidden layer), binary cross-entropy, Adam, a train/validation split by prompt with early
stopping, the ROC curve and AUC, TPR/FPR at the inference threshold eta, and the verifier file.

Labels: token x drawn from q at a prefix is "acceptable" iff q(x)/p(x) <= gamma
(``verify.sprinter.acceptable_tokens``; p(x) = 0 is never acceptable).

Verifier file (``torch.save``): {"format": FILE_FORMAT, "state_dict": ..., "meta": {...}} where
meta holds the feature spec (feature set, dim, target, draft, hidden size), gamma, eta, the
sampling parameters the data were collected with, the architecture and the metrics.
Default location: ``$VERISPEC_CACHE`` (or ``~/.cache/verispec``) ``/sprinter/<target>__<draft>__g<gamma>.pt``.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from verispec.errors import ConfigError
from verispec.verify.sprinter import check_threshold

FILE_FORMAT = "verispec-sprinter-verifier/1"


def default_verifier_path(target_name: str, draft_name: str, gamma: float) -> Path:
    root = os.environ.get("VERISPEC_CACHE") or Path.home() / ".cache" / "verispec"
    return Path(root).expanduser() / "sprinter" / f"{target_name}__{draft_name}__g{gamma:g}.pt"


def labels_for_gamma(target_prob: np.ndarray, draft_prob: np.ndarray, gamma: float) -> np.ndarray:
    """1 where q(x)/p(x) <= gamma ("acceptable"), 0 elsewhere; p(x) = 0 is never acceptable.
    Same arithmetic as ``verify.sprinter.acceptable_tokens`` (q <= gamma p with p > 0)."""
    if gamma <= 0:
        raise ConfigError(f"gamma must be > 0 (the paper uses 1, 1.2, 1.5), got {gamma}")
    target_prob = np.asarray(target_prob, dtype=np.float64)
    draft_prob = np.asarray(draft_prob, dtype=np.float64)
    return ((target_prob > 0) & (draft_prob <= gamma * target_prob)).astype(np.float32)


class VerifierNet(nn.Module):
    """sigmoid(w . standardise(f) + b), or with one ReLU hidden layer of ``hidden`` units."""

    def __init__(self, dim: int, hidden: int = 0):
        super().__init__()
        self.dim, self.hidden = int(dim), int(hidden)
        self.register_buffer("mean", torch.zeros(dim))
        self.register_buffer("scale", torch.ones(dim))
        if hidden:
            self.body = nn.Sequential(nn.Linear(dim, hidden), nn.ReLU(), nn.Linear(hidden, 1))
        else:
            self.body = nn.Linear(dim, 1)

    def logits(self, features: torch.Tensor) -> torch.Tensor:
        return self.body((features - self.mean) / self.scale).squeeze(-1)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(self.logits(features))

    def flops_per_score(self) -> int:
        """Multiply-adds x 2 of one score (standardisation included)."""
        if self.hidden:
            return 2 * (self.dim * self.hidden + self.hidden) + 2 * self.dim
        return 2 * self.dim + 2 * self.dim


@dataclass
class TrainedVerifier:
    """A verifier ready for decoding: ``score(features) -> s in (0, 1)``, accept iff s >= eta."""

    net: VerifierNet
    meta: dict
    eta: float

    def __post_init__(self):
        self.eta = check_threshold(self.eta)
        self.net.eval()

    @torch.no_grad()
    def scores(self, features: np.ndarray) -> np.ndarray:
        """features (n, dim) -> scores (n,) float64."""
        tensor = torch.as_tensor(np.asarray(features, dtype=np.float32))
        return self.net(tensor).double().numpy()

    def accepts(self, features: np.ndarray) -> np.ndarray:
        return self.scores(features) >= self.eta

    @property
    def gamma(self) -> float:
        return float(self.meta["gamma"])


def save_verifier(path: str | Path, net: VerifierNet, meta: dict) -> Path:
    path = Path(path).expanduser()
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"format": FILE_FORMAT, "state_dict": net.state_dict(), "meta": meta}, path)
    return path


def load_verifier(path: str | Path, eta: float | None = None, extractor=None) -> TrainedVerifier:
    """Load a verifier file; with ``extractor`` refuse a file trained for another pair
    (``features.check_compatible``). ``eta`` overrides the file's threshold (must lie in (0, 1))."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise ConfigError(f"SPRINTER verifier file {str(path)!r} not found; train one with `verispec sprinter train`")
    try:
        blob = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # a corrupt file or not a torch file at all
        raise ConfigError(f"{path} is not a SPRINTER verifier file ({error})") from error
    if not isinstance(blob, dict) or blob.get("format") != FILE_FORMAT:
        raise ConfigError(f"{path} is not a SPRINTER verifier file (format {blob.get('format') if isinstance(blob, dict) else None!r}, expected {FILE_FORMAT!r})")
    meta = dict(blob["meta"])
    if extractor is not None:
        from verispec.sprinter.features import check_compatible

        check_compatible(meta, extractor, source=f"verifier file {path}")
    net = VerifierNet(int(meta["dim"]), int(meta.get("hidden_units", 0)))
    net.load_state_dict(blob["state_dict"])
    return TrainedVerifier(net, meta, meta["eta"] if eta is None else eta)


# ----- metrics -----------------------------------------------------------------------------------
def roc_curve(labels: np.ndarray, scores: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(fpr, tpr, thresholds): one point per distinct score, from the highest threshold down
    (accept iff score >= threshold), starting at (0, 0)."""
    labels = np.asarray(labels, dtype=np.float64)
    scores = np.asarray(scores, dtype=np.float64)
    order = np.argsort(-scores, kind="mergesort")
    scores, labels = scores[order], labels[order]
    distinct = np.flatnonzero(np.diff(scores)) if len(scores) > 1 else np.array([], dtype=int)
    ends = np.append(distinct, len(scores) - 1)
    true_pos = np.cumsum(labels)[ends]
    false_pos = (ends + 1) - true_pos
    positives, negatives = labels.sum(), len(labels) - labels.sum()
    tpr = np.concatenate([[0.0], true_pos / max(positives, 1)])
    fpr = np.concatenate([[0.0], false_pos / max(negatives, 1)])
    return fpr, tpr, np.concatenate([[np.inf], scores[ends]])


def roc_auc(labels: np.ndarray, scores: np.ndarray) -> float:
    """Area under the ROC curve (ties count one half); NaN if one class is missing."""
    labels = np.asarray(labels)
    if labels.min() == labels.max():
        return float("nan")
    fpr, tpr, _ = roc_curve(labels, scores)
    return float(np.trapezoid(tpr, fpr) if hasattr(np, "trapezoid") else np.trapz(tpr, fpr))


def rates_at(labels: np.ndarray, scores: np.ndarray, eta: float) -> dict:
    """TPR = P(s >= eta | acceptable), FPR = P(s >= eta | not acceptable), and the accept rate."""
    labels = np.asarray(labels).astype(bool)
    accept = np.asarray(scores) >= eta
    return {
        "tpr": float(accept[labels].mean()) if labels.any() else float("nan"),
        "fpr": float(accept[~labels].mean()) if (~labels).any() else float("nan"),
        "accept_rate": float(accept.mean()),
        "positive_rate": float(labels.mean()),
        "n": int(len(labels)),
    }


# ----- training ----------------------------------------------------------------------------------
@dataclass
class TrainConfig:
    gamma: float = 1.2
    eta: float = 0.5
    hidden_units: int = 0
    learning_rate: float = 5e-3
    weight_decay: float = 1e-4
    batch_size: int = 512
    max_epochs: int = 60
    patience: int = 6
    val_fraction: float = 0.2
    seed: int = 0
    max_seconds: float = 20 * 60.0


def split_by_prompt(prompt_ids: np.ndarray, val_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Boolean masks (train, val): whole prompts go to validation, so it measures held-out prompts."""
    unique = np.unique(prompt_ids)
    rng = np.random.default_rng(seed)
    count = max(1, int(round(val_fraction * len(unique)))) if len(unique) > 1 else 0
    val_prompts = set(rng.choice(unique, size=count, replace=False).tolist()) if count else set()
    val = np.array([p in val_prompts for p in prompt_ids])
    if not val.any():  # one prompt only: split its samples
        val = rng.random(len(prompt_ids)) < val_fraction
    return ~val, val


def _bce_loss(net, features, labels, pos_weight=None):
    return nn.functional.binary_cross_entropy_with_logits(net.logits(features), labels, pos_weight=pos_weight)


def train_verifier(features: np.ndarray, labels: np.ndarray, prompt_ids: np.ndarray, config: TrainConfig, log=print) -> tuple[VerifierNet, dict]:
    """Fit the verifier with Adam on BCE, early stopping on validation loss (whole prompts held
    out). features (n, dim), labels (n,) in {0, 1}, prompt_ids (n,). Returns (net, report)."""
    check_threshold(config.eta)
    torch.manual_seed(config.seed)
    features = np.asarray(features, dtype=np.float32)
    labels = np.asarray(labels, dtype=np.float32)
    train_mask, val_mask = split_by_prompt(np.asarray(prompt_ids), config.val_fraction, config.seed)
    x_train, y_train = torch.from_numpy(features[train_mask]), torch.from_numpy(labels[train_mask])
    x_val, y_val = torch.from_numpy(features[val_mask]), torch.from_numpy(labels[val_mask])
    if len(x_train) == 0 or len(x_val) == 0:
        raise ConfigError(f"need samples from at least 2 prompts to split train/validation, got {len(features)} samples")

    net = VerifierNet(features.shape[1], config.hidden_units)
    net.mean.copy_(x_train.mean(0))
    net.scale.copy_(x_train.std(0).clamp_min(1e-6))
    optimizer = torch.optim.Adam(net.parameters(), lr=config.learning_rate, weight_decay=config.weight_decay)
    generator = torch.Generator().manual_seed(config.seed)
    best_loss, best_state, best_epoch, stale = float("inf"), None, -1, 0
    history = []
    start = time.perf_counter()
    for epoch in range(config.max_epochs):
        net.train()
        order = torch.randperm(len(x_train), generator=generator)
        total = 0.0
        for begin in range(0, len(order), config.batch_size):
            batch = order[begin : begin + config.batch_size]
            optimizer.zero_grad()
            loss = _bce_loss(net, x_train[batch], y_train[batch])
            loss.backward()
            optimizer.step()
            total += float(loss.detach()) * len(batch)
        net.eval()
        with torch.no_grad():
            val_loss = float(_bce_loss(net, x_val, y_val))
            val_scores = net(x_val).numpy()
        val_auc = roc_auc(y_val.numpy(), val_scores)
        history.append({"epoch": epoch, "train_loss": total / len(x_train), "val_loss": val_loss, "val_auc": val_auc})
        log(f"epoch {epoch:3d}  train BCE {total / len(x_train):.4f}  val BCE {val_loss:.4f}  val AUC {val_auc:.4f}")
        if val_loss < best_loss - 1e-5:
            best_loss, best_epoch, stale = val_loss, epoch, 0
            best_state = {k: v.clone() for k, v in net.state_dict().items()}
        else:
            stale += 1
            if stale >= config.patience:
                log(f"early stop at epoch {epoch} (best {best_epoch})")
                break
        if time.perf_counter() - start > config.max_seconds:
            log(f"time limit {config.max_seconds:.0f} s reached at epoch {epoch}")
            break
    net.load_state_dict(best_state)
    net.eval()
    with torch.no_grad():
        val_scores = net(x_val).numpy()
    report = {
        "best_epoch": best_epoch,
        "epochs_run": len(history),
        "train_seconds": time.perf_counter() - start,
        "train_samples": int(train_mask.sum()),
        "val_samples": int(val_mask.sum()),
        "val_prompts": int(len(np.unique(np.asarray(prompt_ids)[val_mask]))),
        "val_loss": best_loss,
        "val_auc": roc_auc(y_val.numpy(), val_scores),
        "val_rates": rates_at(y_val.numpy(), val_scores, config.eta),
        "history": history,
    }
    return net, report


def plot_roc(curves: dict[str, tuple[np.ndarray, np.ndarray, float]], eta_points: dict[str, tuple[float, float]], path: str | Path) -> Path:
    """ROC curves {label: (fpr, tpr, auc)} with the operating points at eta marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axis = plt.subplots(figsize=(4.5, 4.5))
    for label, (fpr, tpr, auc) in curves.items():
        axis.plot(fpr, tpr, label=f"{label} (AUC {auc:.3f})")
    for label, (fpr, tpr) in eta_points.items():
        axis.scatter([fpr], [tpr], marker="o", zorder=3, label=label)
    axis.plot([0, 1], [0, 1], color="grey", linestyle=":", linewidth=1)
    axis.set_xlabel("false positive rate (accepts a non-acceptable token)")
    axis.set_ylabel("true positive rate")
    axis.set_title("SPRINTER verifier ROC")
    axis.legend(loc="lower right", fontsize=7)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def write_json(path: str | Path, record: dict) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=1, default=float))
    return path
