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
import sys
from pathlib import Path

from gem.config import iso_time
from gem.errors import UserError


class ScoreRefused(UserError, ValueError):
    """A model and a features window that do not describe the same examples."""


def score(model: str, features: str, out: str | Path, *, cuts: list[str] | None = None,
          split_file: str | None = None, part: str = "", batch_size: int = 2048,
          tracking_uri: str | None = None) -> dict:
    import numpy as np
    import pandas as pd
    import torch

    from gem.data.contract import parse_utc
    from gem.features.loader import FeatureLoader
    from gem.features.vocab import check_vocabularies
    from gem.knowledge.windows import example_keys
    from gem.model.store import load_model
    from gem.protocol import assign_split
    from gem.training.metrics import SurfaceTaskMetrics

    stored = load_model(model, tracking_uri)
    net = stored.model.eval()
    loader = FeatureLoader(features, batch_size=batch_size, shuffle=False)
    spec = loader.spec
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
    keys = example_keys(features, None).set_index("example_id").loc[ids]
    time_us = keys["event_timestamp"].astype("int64").to_numpy() // 1000
    keep = np.ones(len(ids), bool)
    if cuts or split_file:
        us = [int(parse_utc(c).timestamp() * 1_000_000) for c in cuts] if cuts else None
        parts = assign_split(ids, time_us, cuts=us, ids_file=split_file)
        keep = parts == part
    frame = pd.DataFrame({"example_id": ids[keep], "surface": np.asarray(spec.surfaces, object)[surface[keep]],
                          "event_time": pd.to_datetime(time_us[keep], unit="us", utc=True)})
    for t, task in enumerate(spec.tasks):
        frame[f"label_{task}"] = labels[keep, t].astype(np.int8)
        frame[f"p_{task}"] = probs[keep, t].astype(np.float32)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    frame.sort_values("example_id").to_parquet(out, index=False)
    metrics = SurfaceTaskMetrics(spec.surfaces, spec.tasks)
    if keep.any():
        metrics.update(torch.from_numpy(probs[keep]), torch.from_numpy(labels[keep]),
                       torch.from_numpy(surface[keep]))
    computed = {k: float(v) for k, v in metrics.compute().items()} if keep.any() else {}
    return {"examples": int(keep.sum()), "out": str(out), "metrics": computed}


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
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    if (args.cut or args.split_file) and not args.part:
        print("error: --part is required with --cut or --split-file", file=sys.stderr)
        return 2
    if args.cut and args.split_file:
        print("error: give --cut or --split-file, not both", file=sys.stderr)
        return 2
    result = score(args.model, args.features, args.out, cuts=args.cut or None, split_file=args.split_file,
                   part=args.part, tracking_uri=args.tracking_uri)
    print(f"scored {result['examples']} examples -> {result['out']}")
    for key, value in sorted(result["metrics"].items()):
        if "auc" in key:
            print(f"  {key}: {value:.4f}")
    return 0
