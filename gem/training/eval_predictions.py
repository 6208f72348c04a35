"""The predictions a training run made on its evaluation window, kept beside its model
so that the teacher's gate need not score the same weights on the same window again
(gem_app/stages/gate.py ``teacher_predictions``).

    kept = KeptPredictions(window_digest)      # trainer.evaluate(..., keep=kept) fills it
    kept.write(out / EVAL_PREDICTIONS, model_digest=verify(out / "model"), tasks=spec.tasks)
    read_kept(path, model_digest=..., features_dir=..., task="click")  # None unless the same

``model_digest``: the sha256 of the exported weights.pt (what gem.model.store records in
digests.json and checks on every load); the window's digest: its manifest's content
digest. A file is read back only when both are the ones asked for and it holds one row
per example of the window; otherwise the caller scores the model as before. The
trainer keeps predictions only when they are what scoring the exported model gives:
one process, fp32, the whole window (gem.training.trainer ``keeps_predictions``).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

EVAL_PREDICTIONS = "eval_predictions.parquet"
FORMAT = "gem-eval-predictions/1"
_META = b"gem"


def window_manifest(features_dir: str | Path) -> dict:
    """A finished features window's manifest ({} when there is none). Not
    gem.features.loader.read_manifest: that module loads torch, which the teacher gate
    reading kept predictions does without."""
    path = Path(features_dir) / "manifest.json"
    return json.loads(path.read_text()) if path.is_file() else {}


class KeptPredictions:
    def __init__(self, features_digest: str) -> None:
        self.features_digest = features_digest
        self.parts: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []

    def add(self, example_id, probs, labels) -> None:
        """One evaluated batch: example ids (B,), probabilities and labels (B, T) tensors."""
        self.parts.append((example_id.cpu().numpy().astype(np.int64), probs.detach().float().cpu().numpy(),
                           labels.detach().float().cpu().numpy()))

    def write(self, path: str | Path, *, model_digest: str, tasks) -> Path:
        import pyarrow as pa

        from gem.features.storage import write_parquet_atomic

        ids, probs, labels = (np.concatenate(part) for part in zip(*self.parts))
        columns = {"example_id": pa.array(ids)}
        for t, task in enumerate(tasks):
            columns[f"prob_{task}"] = pa.array(probs[:, t])
            columns[f"label_{task}"] = pa.array(labels[:, t])
        meta = {"format": FORMAT, "model_digest": model_digest, "features_digest": self.features_digest,
                "examples": int(len(ids))}
        write_parquet_atomic(pa.table(columns).replace_schema_metadata({_META: json.dumps(meta)}), Path(path))
        return Path(path)


def read_kept(path: str | Path, *, model_digest: str, features_dir: str | Path,
              task: str) -> tuple[np.ndarray, np.ndarray] | None:
    """(labels, probabilities) of ``task`` as float64, one per example of the window
    ``features_dir``, when ``path`` holds the predictions of the weights ``model_digest``
    on that very window; else None."""
    import pyarrow.parquet as pq

    path = Path(path)
    manifest = window_manifest(features_dir)
    if not path.is_file() or not manifest.get("digest"):
        return None
    table = pq.read_table(path)
    meta = json.loads((table.schema.metadata or {}).get(_META, b"{}"))
    if (meta.get("format") != FORMAT or meta.get("model_digest") != model_digest
            or meta.get("features_digest") != manifest["digest"] or f"prob_{task}" not in table.column_names):
        return None
    ids = table.column("example_id").to_numpy()
    if len(ids) != manifest.get("counts", {}).get("examples") or len(np.unique(ids)) != len(ids):
        return None
    return (table.column(f"label_{task}").to_numpy().astype(np.float64),
            table.column(f"prob_{task}").to_numpy().astype(np.float64))
