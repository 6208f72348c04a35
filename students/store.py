"""A student saved and loaded as tensors and JSON, checked by digest, never unpickled
(the same folder format as gem.model.store: weights.pt + digests.json, with the
student's constructor arguments in student_config.json).

    save_student(model, "runs/x/student")
    model = load_student("models:/student_feed/3")     # or a folder, or runs:/<id>/student
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

from gem.model.store import WEIGHTS, load_weights, resolve, save_weights, verify, write_digests
from students.model import VerticalStudent

STUDENT_CONFIG = "student_config.json"
STUDENT_FILES = (WEIGHTS, STUDENT_CONFIG)


def student_arguments(model: VerticalStudent) -> dict:
    """What rebuilds the student's modules: its config and table sizes."""
    # cardinalities as [key, size] pairs: their order is the order of the input columns
    return {"cfg": asdict(model.cfg), "cardinalities": [[k, int(t.num_embeddings)] for k, t in model.tables.items()],
            "num_dense": int(model.num_dense), "teacher_emb_dim": int(model.teacher_emb_dim),
            "num_surfaces": int(model.surface_embedding.num_embeddings) if model.surface_embedding is not None else 0,
            "vocab_digests": dict(model.vocab_digests), "knowledge": dict(getattr(model, "knowledge", {}) or {})}


def save_student(model: VerticalStudent, folder: str | Path) -> Path:
    folder = save_weights(model, folder)
    (folder / STUDENT_CONFIG).write_text(json.dumps(student_arguments(model), indent=2, sort_keys=True))
    write_digests(folder, STUDENT_FILES)
    return folder


def load_student(source: str | Path, tracking_uri: str | None = None) -> VerticalStudent:
    """The student in eval mode from a folder or an MLflow URI, its files verified first."""
    from gem.config import from_dict
    from students.config import StudentModelConfig

    folder, _, _ = resolve(source, tracking_uri)
    verify(folder, STUDENT_FILES)  # a folder without student_config.json is refused here
    args = json.loads((folder / STUDENT_CONFIG).read_text())
    model = VerticalStudent(from_dict(StudentModelConfig, args["cfg"]), dict(args["cardinalities"]), args["num_dense"],
                            args["teacher_emb_dim"], args["num_surfaces"], vocab_digests=args.get("vocab_digests"),
                            knowledge=args.get("knowledge"))
    model.load_state_dict(load_weights(folder))
    return model.eval()
