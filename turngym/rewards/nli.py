"""An NLI cross-encoder (any Hugging Face sequence-classification model) giving entailment probabilities.

Used for answer equivalence (strict bidirectional entailment) and for evidence support
(observation entails the answer). The reference setting is ``microsoft/deberta-v2-xlarge-mnli``;
any local directory or hub id with an ``entailment`` label works.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


@dataclass
class NLIModel:
    model: Any
    tokenizer: Any
    batch_size: int = 16
    max_length: int = 512

    @classmethod
    def load(cls, model_id_or_path: str, device: str | None = None, **kwargs: Any) -> NLIModel:
        import torch
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        try:
            tok = AutoTokenizer.from_pretrained(model_id_or_path)
            model = AutoModelForSequenceClassification.from_pretrained(model_id_or_path).to(device).eval()
        except OSError as exc:
            raise RuntimeError(f"could not load NLI model {model_id_or_path!r}: {exc}") from exc
        return cls(model=model, tokenizer=tok, **kwargs)

    def __post_init__(self) -> None:
        labels = {int(k): str(v).lower() for k, v in self.model.config.id2label.items()}
        hits = [i for i, name in labels.items() if name.startswith("entail")]
        if len(hits) != 1:
            raise ValueError(f"NLI model has no single 'entailment' label (labels: {labels})")
        self.entail_index = hits[0]

    def _logits(self, pairs: Sequence[tuple[str, str]]):
        import torch

        device = next(self.model.parameters()).device
        chunks = []
        for start in range(0, len(pairs), self.batch_size):
            chunk = pairs[start:start + self.batch_size]
            enc = self.tokenizer([p for p, _ in chunk], [h for _, h in chunk], return_tensors="pt",
                                 padding=True, truncation=True, max_length=self.max_length)
            with torch.inference_mode():
                chunks.append(self.model(**{k: v.to(device) for k, v in enc.items()}).logits.float().cpu())
        return torch.cat(chunks) if chunks else torch.zeros(0, len(self.model.config.id2label))

    def entailment(self, pairs: Sequence[tuple[str, str]]) -> list[float]:
        """P(entailment) for each (premise, hypothesis), batched."""
        import torch

        return torch.softmax(self._logits(pairs), dim=-1)[:, self.entail_index].tolist()

    def entails(self, pairs: Sequence[tuple[str, str]]) -> list[bool]:
        """Strict: entailment is the arg-max label."""
        return (self._logits(pairs).argmax(-1) == self.entail_index).tolist()
