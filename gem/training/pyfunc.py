"""The teacher as an MLflow pyfunc model: what it takes, what it returns, and the
scoring behind it.

    model = mlflow.pyfunc.load_model("models:/gem_teacher@champion")
    preds = model.predict(pd.DataFrame({"features": ["runs/main/features/holdout"]}))
    # one row per example of the window: example_id, surface, p_<task> (p_click, ...)

Input: one row per features window (a folder written by `python -m gem features build`
or the pipeline, built with the teacher's vocabularies); param ``max_examples`` (0 =
all) stops early. The model is logged "from code" (``mlflow_teacher.py``, no pickle):
loading runs that file, which reads the weights through gem.model.store (every file
checked against digests.json, weights read weights-only).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

CODE = Path(__file__).with_name("mlflow_teacher.py")
INPUT_COLUMN = "features"
MAX_EXAMPLES = "max_examples"
# Loading needs these and this project installed; torchrec goes in with --no-deps (its
# metadata pins the CUDA fbgemm-gpu).
PIP_REQUIREMENTS = [
    "torch==2.13.0", "fbgemm-gpu-cpu==1.8.0", "tensordict", "pyre-extensions", "torchmetrics==1.0.3", "numpy",
    "pandas", "pyarrow", "pyyaml", "mlflow==3.17.2",
]


def predict_window(model, model_spec, features: str | Path, *, max_examples: int = 0, batch_size: int = 1024,
                   name: str = "the teacher") -> dict[str, np.ndarray]:
    """Every example of a features window through the model, in loader order:
    ``example_id``, ``surface`` (index), ``probs`` (N, T) and ``labels`` (N, T); a
    window of other vocabularies, surfaces or tasks is refused."""
    import torch

    from gem.features.loader import FeatureLoader

    features = str(features)
    if not (Path(features) / "manifest.json").is_file():
        raise FileNotFoundError(f"{features}: not a finished features window (no manifest.json)")
    loader = FeatureLoader(features, batch_size=batch_size, shuffle=False)
    spec = loader.spec
    _check_window(model_spec, spec, name, features)
    parts: dict[str, list] = {"example_id": [], "surface": [], "probs": [], "labels": []}
    seen = 0
    model.eval()
    with torch.no_grad():
        for batch in loader:
            parts["example_id"].append(batch.example_id.numpy())
            parts["surface"].append(batch.surface.numpy())
            parts["probs"].append(model(batch).probabilities().float().numpy())
            parts["labels"].append(batch.labels.numpy())
            seen += batch.batch_size
            if max_examples and seen >= max_examples:
                break
    tasks = len(spec.tasks)
    out = {k: np.concatenate(v) if v else np.zeros((0, tasks) if k in ("probs", "labels") else 0)
           for k, v in parts.items()}
    if max_examples:
        out = {k: v[:max_examples] for k, v in out.items()}
    out["spec"] = spec
    return out


def _check_window(model_spec, spec, name: str, features: str) -> None:
    try:
        from gem.features.vocab import check_vocabularies
    except ImportError:  # a build of the library without vocabulary digests
        check_vocabularies = None
    if check_vocabularies is not None and getattr(model_spec, "vocab_digests", None) is not None:
        check_vocabularies(model_spec.vocab_digests, spec.vocab_digests, model=name, window=features)
    if list(model_spec.surfaces) != list(spec.surfaces) or list(model_spec.tasks) != list(spec.tasks):
        raise ValueError(f"{name} was trained on surfaces {model_spec.surfaces} / tasks {model_spec.tasks}; "
                         f"{features} has {spec.surfaces} / {spec.tasks}")


def score_frame(model, model_spec, model_input, params: dict | None = None):
    """The pyfunc ``predict``: a DataFrame with a ``features`` column -> one row per
    example of each window (example_id, surface, p_<task>)."""
    import pandas as pd

    frame = model_input if isinstance(model_input, pd.DataFrame) else pd.DataFrame(model_input)
    if INPUT_COLUMN not in frame.columns:
        raise ValueError(f"the teacher's input is a table with a {INPUT_COLUMN!r} column (a features window "
                         f"folder per row); got columns {list(frame.columns)}")
    limit = int((params or {}).get(MAX_EXAMPLES) or 0)
    outputs = []
    from gem.utils.paths import located

    for features in frame[INPUT_COLUMN]:  # a folder, a file URI, or relative to $GEM_WORKSPACE / here
        scored = predict_window(model, model_spec, str(located(str(features))), max_examples=limit)
        names = np.asarray(scored["spec"].surfaces, dtype=object)
        out = pd.DataFrame({"example_id": scored["example_id"].astype(np.int64),
                            "surface": names[scored["surface"]] if len(scored["surface"]) else []})
        for t, task in enumerate(scored["spec"].tasks):
            out[f"p_{task}"] = scored["probs"][:, t].astype(np.float64)
        outputs.append(out)
    return pd.concat(outputs, ignore_index=True) if outputs else pd.DataFrame(columns=["example_id", "surface"])


def signature(tasks: list[str]):
    """Input: a ``features`` column; output: example_id, surface, p_<task> per task;
    param ``max_examples``."""
    from mlflow.models import ModelSignature
    from mlflow.types import ColSpec, ParamSchema, ParamSpec, Schema

    outputs = [ColSpec("long", "example_id"), ColSpec("string", "surface"),
               *(ColSpec("double", f"p_{task}") for task in tasks)]
    return ModelSignature(inputs=Schema([ColSpec("string", INPUT_COLUMN)]), outputs=Schema(outputs),
                          params=ParamSchema([ParamSpec(MAX_EXAMPLES, "long", 0)]))


def input_example(features: str | Path | None, examples: int = 64):
    """A window to score (at most ``examples`` of it): also what MLflow scores once when
    it logs the model, to check the example works."""
    if not features:
        return None
    import pandas as pd

    from gem.utils.paths import shown

    # relative to the run's workspace (score_frame reads it back), never a machine path
    return pd.DataFrame({INPUT_COLUMN: [shown(features)]}), {MAX_EXAMPLES: examples}


def load_instructions(uri: str, features_hint: str = "<features window folder>") -> str:
    return (f"```python\nimport mlflow, pandas as pd\nmodel = mlflow.pyfunc.load_model(\"{uri}\")\n"
            f"preds = model.predict(pd.DataFrame({{\"features\": [\"{features_hint}\"]}}))\n```\n"
            "One row per example of the window: `example_id`, `surface`, `p_<task>`. The window must be built with "
            "the teacher's vocabularies (`vocab_from`). Needs this project installed (and torchrec with `--no-deps`); "
            "the weights are read weights-only after a digest check (gem.model.store), never unpickled.")
