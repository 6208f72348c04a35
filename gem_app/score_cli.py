"""`python -m gem score`: one prediction per example of a features window.

    python -m gem score --model MODEL --features DIR --out preds.parquet \
        [--split-file ids.parquet --part test | --cut ISO [--cut ISO] --part test]

Writes ``example_id``, ``surface`` (the data's name), ``event_time``, the labels
(``label_<task>``) and the model's probabilities (``p_<task>``) for every example of
the window (or exactly the examples of one part of an explicit split), and prints the
AUC per task of what it wrote. MODEL: a model folder or an MLflow models:/ URI.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from gem.config import iso_time
from gem.errors import UsageError, UserError


class ScoreRefused(UserError, ValueError):
    """A model and a features window that do not describe the same examples."""


def score(model: str, features: str, out: str | Path, *, cuts: list[str] | None = None,
          split_file: str | None = None, part: str = "", batch_size: int = 2048,
          tracking_uri: str | None = None, allow_empty: bool = False) -> dict:
    """Score ``features`` (or the examples of ``part`` of the split) into the Parquet file
    ``out``. A window or part without any example is refused before the model is loaded
    (exit 2, naming the part and its bounds) unless ``allow_empty``; ``out`` is written
    whole or not at all."""
    import numpy as np
    import pandas as pd
    import torch

    from gem.features.loader import FeatureLoader
    from gem.features.vocab import check_vocabularies
    from gem.knowledge.windows import example_keys
    from gem.model.store import load_model
    from gem.protocol import Split
    from gem.training.metrics import SurfaceTaskMetrics
    from gem.utils.atomic import write_with

    out = Path(out)
    if out.is_dir():
        raise ScoreRefused(f"--out {out}: a folder; give the Parquet file to write")
    loader = FeatureLoader(features, batch_size=batch_size, shuffle=False)
    spec, window = loader.spec, loader.manifest.get("window") or {}
    keys = example_keys(features, None).set_index("example_id")
    split = Split.from_options(cuts, split_file)
    if split is not None:
        wanted = int((split.parts(keys.index.to_numpy(), _time_us(keys)) == part).sum())
    else:
        wanted = len(keys)
    if not wanted and not allow_empty:
        if split is not None:
            raise split.empty_part(part, features, window)
        raise ScoreRefused(f"{features}: the window [{window.get('start')}, {window.get('end')}) holds no example; "
                           "build one that does, or pass --allow-empty to write an empty file")
    stored = load_model(model, tracking_uri)
    net = stored.model.eval()
    check_vocabularies(stored.spec.vocab_digests, spec.vocab_digests, model=f"model {model}", window=str(features))
    if list(stored.spec.surfaces) != list(spec.surfaces) or list(stored.spec.tasks) != list(spec.tasks):
        raise ScoreRefused(f"the model was trained on surfaces {stored.spec.surfaces} / tasks {stored.spec.tasks}; "
                           f"{features} has {spec.surfaces} / {spec.tasks}")
    ids, probs, labels, surface = [], [], [], []
    with torch.no_grad():
        for batch in loader:
            ids.append(batch.example_id.numpy())
            probs.append(net(batch).probabilities().float().numpy())
            labels.append(batch.labels.numpy())
            surface.append(batch.surface.numpy())
    ids = np.concatenate(ids) if ids else np.zeros(0, np.int64)
    probs = np.concatenate(probs) if probs else np.zeros((0, len(spec.tasks)))
    labels = np.concatenate(labels) if labels else np.zeros((0, len(spec.tasks)))
    surface = np.concatenate(surface) if surface else np.zeros(0, np.int64)
    time_us = _time_us(keys.loc[ids])
    keep = np.ones(len(ids), bool) if split is None else split.parts(ids, time_us) == part
    frame = pd.DataFrame({"example_id": ids[keep], "surface": np.asarray(spec.surfaces, object)[surface[keep]],
                          "event_time": pd.to_datetime(time_us[keep], unit="us", utc=True)})
    for t, task in enumerate(spec.tasks):
        frame[f"label_{task}"] = labels[keep, t].astype(np.int8)
        frame[f"p_{task}"] = probs[keep, t].astype(np.float32)
    frame = frame.sort_values("example_id")
    write_with(lambda tmp: frame.to_parquet(tmp, index=False), out)
    metrics = SurfaceTaskMetrics(spec.surfaces, spec.tasks)
    if keep.any():
        metrics.update(torch.from_numpy(probs[keep]), torch.from_numpy(labels[keep]),
                       torch.from_numpy(surface[keep]))
    computed = {k: float(v) for k, v in metrics.compute().items()} if keep.any() else {}
    return {"examples": int(keep.sum()), "out": str(out), "metrics": computed}


def _time_us(keys):
    """Event time (us since the epoch) of each row of ``example_keys``."""
    return keys["event_timestamp"].astype("int64").to_numpy() // 1000


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("score", help="one prediction per example of a features window",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="model folder or models:/NAME/VERSION")
    p.add_argument("--features", required=True, help="a features window (gem features build)")
    p.add_argument("--out", required=True, help="output Parquet file")
    p.add_argument("--cut", action="append", default=[], type=iso_time, help="time cut point (ISO); repeat for two")
    p.add_argument("--split-file", default=None, help="Parquet/CSV with example_id, part")
    p.add_argument("--part", default="", choices=("", "train", "validation", "test"),
                   help="score only this part of the split")
    p.add_argument("--tracking-uri", default=None)
    p.add_argument("--allow-empty", action="store_true",
                   help="write an empty file when the window or part holds no example, instead of refusing (exit 2)")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    if (args.cut or args.split_file) and not args.part:
        raise UsageError("--part is required with --cut or --split-file")
    if args.part and not (args.cut or args.split_file):
        raise UsageError(f"--part {args.part} needs --cut or --split-file (without them the whole window is scored)")
    if args.cut and args.split_file:
        raise UsageError("give --cut or --split-file, not both")
    if len(args.cut) > 2:
        raise UsageError(f"--cut: once (train/test) or twice (train/validation/test), got {len(args.cut)}")
    result = score(args.model, args.features, args.out, cuts=args.cut or None, split_file=args.split_file,
                   part=args.part, tracking_uri=args.tracking_uri, allow_empty=args.allow_empty)
    print(f"scored {result['examples']} examples -> {result['out']}")
    for key, value in sorted(result["metrics"].items()):
        if "auc" in key:
            print(f"  {key}: {value:.4f}")
    return 0
