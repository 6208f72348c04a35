"""An explicit split (a file of example ids, or time cut points) is honoured row for row:
the loader yields exactly one part's examples, training fits exactly the part "train"
and evaluates exactly the part asked for."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from gem.features.loader import FeatureLoader
from gem.protocol import Split
from tests.features.conftest import collect


@pytest.fixture(scope="module")
def features_dir(tiny_dataset, tmp_path_factory):
    from gem.config import load_config
    from gem.features.build import build_features
    from gem.features.config import FeaturesConfig

    out = tmp_path_factory.mktemp("split-features") / "feat"
    build_features(tiny_dataset, out, load_config(FeaturesConfig, section="features", preset="tiny"))
    return out


@pytest.fixture(scope="module")
def split_file(features_dir, tmp_path_factory):
    """30% of the examples train, a quarter validation, some test, the rest unlisted, and
    ids of no example of the window (ignored)."""
    ids = collect(FeatureLoader(features_dir, batch_size=512, shuffle=False)).ids
    rng = np.random.default_rng(7)
    part = rng.choice(["train", "validation", "test", ""], size=len(ids), p=[0.3, 0.25, 0.15, 0.3])
    listed = part != ""
    frame = pd.DataFrame({"example_id": np.r_[ids[listed], [-5, -6]],
                          "part": np.r_[part[listed], ["train", "test"]]})
    path = tmp_path_factory.mktemp("split") / "ids.csv"
    frame.to_csv(path, index=False)
    return path, {p: set(ids[part == p].tolist()) for p in ("train", "validation", "test")}


def test_the_loader_yields_exactly_one_part_row_for_row(features_dir, split_file):
    path, want = split_file
    everything = collect(FeatureLoader(features_dir, batch_size=512, shuffle=False))
    split = Split(ids_file=str(path))
    for part in ("train", "validation", "test"):
        for order in ("random", "time"):
            got = collect(FeatureLoader(features_dir, batch_size=32, seed=1, shard_order=order, split=split,
                                        part=part))
            assert len(got) == len(set(got.ids.tolist())) == len(want[part])
            assert set(got.ids.tolist()) == want[part]
    got = collect(FeatureLoader(features_dir, batch_size=32, seed=1, split=split, part="train"))
    for eid in list(got)[::9]:  # the same example, element for element
        for key, value in got[eid].items():
            np.testing.assert_array_equal(value, everything[eid][key], err_msg=f"{eid} {key}")
    # time cut points: train < cuts[0] <= validation < cuts[1] <= test
    from gem.knowledge.windows import example_keys

    keys = example_keys(features_dir)
    t = keys["event_timestamp"].astype("int64").to_numpy() // 1000
    cuts = (int(np.quantile(t, 0.6)), int(np.quantile(t, 0.8)))
    got = collect(FeatureLoader(features_dir, batch_size=64, split=Split(cuts=cuts), part="validation"))
    assert set(got.ids.tolist()) == set(keys["example_id"][(t >= cuts[0]) & (t < cuts[1])].tolist())
    # a loader state is only resumed under the same split
    state = FeatureLoader(features_dir, batch_size=32, split=split, part="train").state_dict()
    with pytest.raises(ValueError, match="split"):
        FeatureLoader(features_dir, batch_size=32, split=split, part="test").load_state_dict(state)
    with pytest.raises(ValueError, match="split"):
        FeatureLoader(features_dir, batch_size=32).load_state_dict(state)


def test_train_fits_only_the_train_ids_and_evaluates_the_validation_ids(features_dir, split_file, tmp_path,
                                                                         monkeypatch, capsys):
    """`python -m gem train --split-file` (in-process, so the real steps can be watched)."""
    import mlflow

    from gem.training import trainer
    from gem_app.cli import main

    path, want = split_file
    seen = {"train": [], "eval": []}
    real_train, real_eval = trainer.train_step, trainer.eval_step

    def train_step(model, batch, *args, **kwargs):
        seen["train"].append(batch.example_id.numpy().copy())
        return real_train(model, batch, *args, **kwargs)

    def eval_step(model, batch, *args, **kwargs):
        seen["eval"].append(batch.example_id.numpy().copy())
        return real_eval(model, batch, *args, **kwargs)

    monkeypatch.setattr(trainer, "train_step", train_step)
    monkeypatch.setattr(trainer, "eval_step", eval_step)
    uri = f"sqlite:///{tmp_path / 'm.db'}"
    settings = ["system_metrics=false", "measure_peak=false", "batch_size=32", "log_model=false",
                "checkpoint_every=0", f"tracking_uri={uri}"]
    rc = main(["train", "--features", str(features_dir), "--out", str(tmp_path / "run"), "--preset", "tiny",
               "--split-file", str(path), *[a for s in settings for a in ("--set", s)]])
    assert rc == 0
    trained = np.concatenate(seen["train"]).tolist()
    assert len(trained) == len(set(trained)) == len(want["train"]) // 32 * 32  # one epoch, last batch dropped
    assert set(trained) <= want["train"]
    assert set(np.concatenate(seen["eval"]).tolist()) == want["validation"]
    summary = json.loads(capsys.readouterr().out)
    client = mlflow.MlflowClient(uri)
    run = client.get_run(summary["run_id"])
    assert run.data.params["split.train_examples"] == str(len(want["train"]))
    assert run.data.params["split.eval_part"] == "validation"
    assert run.data.metrics["eval/count/all/click"] == len(want["validation"])
    assert main(["train", "--features", str(features_dir), "--out", str(tmp_path / "x"), "--cut", "2026-01-03",
                 "--split-file", str(path)]) == 2  # a user error: one line, exit 2
    assert "give --cut or --split-file, not both" in capsys.readouterr().err
    with pytest.raises(ValueError, match="no example in part 'train'"):
        trainer.make_loader(str(features_dir), trainer.TrainConfig(), train=True, part="train",
                            split=Split.from_options(["1990-01-01"]))
