"""A student as an MLflow pyfunc model: what it takes, what it returns, and the
scoring behind it.

    model = mlflow.pyfunc.load_model("models:/student_feed@champion")
    preds = model.predict(pd.DataFrame({"features": ["runs/main/features/holdout"],
                                        "feast_repo": ["runs/main/feast"]}))
    # one row per example of the student's surface: example_id, surface, p_<task>

Input: one row per features window (built with the teacher's vocabularies, as the
pipeline's student and holdout windows are) and, for a student that reads the
teacher's embeddings, the Feast repo holding the teacher's knowledge (read
point-in-time at the student's knowledge cadence). Param ``max_examples`` (0 = all)
scores only the first rows. The model is logged "from code" (``mlflow_student.py``, no
pickle): loading runs that file, which reads the weights through students.store (files
checked against digests.json, tensors read weights-only).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

CODE = Path(__file__).with_name("mlflow_student.py")
FEATURES, FEAST_REPO, MAX_EXAMPLES = "features", "feast_repo", "max_examples"
PIP_REQUIREMENTS = ["torch==2.13.0", "numpy", "pandas", "pyarrow", "feast[duckdb]==0.67.0", "mlflow==3.17.2"]


def score_window(model, features: str, *, surface: str, feast_repo: str = "", refresh_every: str = "1d",
                 max_examples: int = 0, name: str = "the student"):
    """The student's probabilities on its surface's rows of a features window:
    (table of those rows, (N, T) probabilities). A window of other vocabularies than the
    student's is refused (VocabularyMismatch, naming both digests); so is, for a student
    reading the teacher's embeddings, a Feast store of another teacher's or dataset's
    knowledge (KnowledgeMismatch, students/lineage.py: the rule). A student reading none
    does not read ``feast_repo``."""
    import torch

    from gem.features.loader import load_feature_spec
    from gem.features.vocab import check_vocabularies
    from students.data import attach_knowledge, load_table
    from students.lineage import check_knowledge
    from students.train import predict

    if not (Path(features) / "manifest.json").is_file():
        raise FileNotFoundError(f"{features}: not a finished features window (no manifest.json)")
    check_vocabularies(model.vocab_digests, load_feature_spec(features).vocab_digests, model=name, window=str(features))
    if model.teacher_emb_dim and feast_repo:  # before any row is read
        check_knowledge(model, feast_repo, name=name)
    table, _ = load_table(features, model.cfg)
    if surface not in table.surfaces:
        raise ValueError(f"{features} has no surface {surface!r} (it has {list(table.surfaces)})")
    part = table.subset(table.surface == list(table.surfaces).index(surface))
    if max_examples:
        part = part.subset(torch.arange(min(max_examples, len(part))))
    if model.teacher_emb_dim:
        if not feast_repo:
            raise ValueError(f"this student reads the teacher's embeddings: give the Feast repo holding them in a "
                             f"{FEAST_REPO!r} column")
        part = attach_knowledge(part, feast_repo, predictions=False, embeddings=True, refresh_every=refresh_every,
                                lineage=False)
    return part, predict(model, part).detach().numpy().astype(np.float64)


def score_frame(model, config: dict, model_input, params: dict | None = None):
    """The pyfunc ``predict``: rows of (features, feast_repo) -> one row per example of
    the student's surface in each window (example_id, surface, p_<task>)."""
    import pandas as pd

    frame = model_input if isinstance(model_input, pd.DataFrame) else pd.DataFrame(model_input)
    if FEATURES not in frame.columns:
        raise ValueError(f"a student's input is a table with a {FEATURES!r} column (a features window folder per "
                         f"row) and, for a student reading teacher embeddings, {FEAST_REPO!r}; got columns "
                         f"{list(frame.columns)}")
    from gem.utils.paths import located

    limit = int((params or {}).get(MAX_EXAMPLES) or 0)
    outputs = []
    for _, row in frame.iterrows():  # folders, file URIs, or relative to $GEM_WORKSPACE / here
        repo = row.get(FEAST_REPO) if FEAST_REPO in frame.columns else ""
        repo = str(located(repo)) if isinstance(repo, str) and repo else ""  # a missing cell: None, NaN or ""
        part, probs = score_window(model, str(located(str(row[FEATURES]))), surface=config["surface"], feast_repo=repo,
                                   refresh_every=config.get("refresh_every", "1d"), max_examples=limit)
        out = pd.DataFrame({"example_id": part.example_id.numpy().astype(np.int64),
                            "surface": [config["surface"]] * len(part)})
        for t, task in enumerate(part.tasks):
            out[f"p_{task}"] = probs[:, t]
        outputs.append(out)
    return pd.concat(outputs, ignore_index=True) if outputs else pd.DataFrame(columns=["example_id", "surface"])


def signature(tasks: list[str]):
    from mlflow.models import ModelSignature
    from mlflow.types import ColSpec, ParamSchema, ParamSpec, Schema

    outputs = [ColSpec("long", "example_id"), ColSpec("string", "surface"),
               *(ColSpec("double", f"p_{task}") for task in tasks)]
    return ModelSignature(inputs=Schema([ColSpec("string", FEATURES), ColSpec("string", FEAST_REPO, required=False)]),
                          outputs=Schema(outputs), params=ParamSchema([ParamSpec(MAX_EXAMPLES, "long", 0)]))


def input_example(features: str | Path | None, feast_repo: str | Path | None = None, examples: int = 64):
    """A window to score (at most ``examples`` rows): also what MLflow scores once when
    it logs the model, to check the example works."""
    if not features:
        return None
    import pandas as pd

    from gem.utils.paths import shown

    # relative to the run's workspace (score_frame reads them back), never a machine path
    row = {FEATURES: [shown(features)]}
    if feast_repo:
        row[FEAST_REPO] = [shown(feast_repo)]
    return pd.DataFrame(row), {MAX_EXAMPLES: examples}


def load_instructions(uri: str, *, embeddings: bool) -> str:
    repo = ', "feast_repo": ["<Feast repo with the teacher\'s knowledge>"]' if embeddings else ""
    return (f"```python\nimport mlflow, pandas as pd\nmodel = mlflow.pyfunc.load_model(\"{uri}\")\n"
            f"preds = model.predict(pd.DataFrame({{\"features\": [\"<features window folder>\"]{repo}}}))\n```\n"
            "One row per example of the student's surface: `example_id`, `surface`, `p_<task>`. Needs this project "
            "installed; the weights are read weights-only after a digest check (students.store), never unpickled.")
