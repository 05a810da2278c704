"""What PyTorch and ONNX Runtime evaluation share: error, per-class error, confusion, the progress bar."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from tqdm import tqdm


@dataclass
class EvalResult:
    n: int
    errors: int
    confusion: np.ndarray  # (K, K): rows true class, columns predicted
    loss: float = float("nan")
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def test_error(self) -> float:
        """errors / n, rounded to the digits n supports (`count_share`)."""
        return count_share(self.errors, self.n)

    def to_dict(self) -> dict[str, Any]:
        per_class_total = self.confusion.sum(axis=1)
        per_class_err = 1.0 - np.diag(self.confusion) / np.maximum(per_class_total, 1)
        return {
            "test_error": self.test_error,
            "test_accuracy": count_share(self.n - self.errors, self.n),
            "n": self.n,
            "errors": self.errors,
            "per_class_error": {str(k): round(float(e), 6) for k, e in enumerate(per_class_err)},
            "confusion_matrix": self.confusion.tolist(),
            **self.extra,
        }

    def card_metrics(self, evaluated_with: str) -> dict[str, Any]:
        """The model card's `metrics` object (docs/model-card.md): MNIST test error, n, errors, per-class error."""
        full = self.to_dict()
        return {
            "mnist_test_error": full["test_error"],
            "n": full["n"],
            "errors": full["errors"],
            "per_class_error": full["per_class_error"],
            "evaluated_with": evaluated_with,
        }


def count_share(count: int, n: int) -> float:
    """count / n rounded to one decimal more than n has digits: distinct counts stay distinct, and no float noise
    (1 - 0.7693 = 0.23070000000000002) is shown; NaN for n = 0."""
    return round(count / n, len(str(n)) + 1) if n else float("nan")


def confusion_matrix(labels: np.ndarray, predictions: np.ndarray, num_classes: int) -> np.ndarray:
    cm = np.zeros((num_classes, num_classes), dtype=np.int64)
    np.add.at(cm, (labels, predictions), 1)
    return cm


def progress_bar(total: int, enabled: bool) -> tqdm[Any]:
    """An evaluation progress bar over `total` images on stderr; a silent one unless `enabled`."""
    return tqdm(total=total, desc="evaluating", unit="img", disable=not enabled, mininterval=1.0, file=sys.stderr)
