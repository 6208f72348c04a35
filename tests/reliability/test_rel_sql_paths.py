"""Defect 7c: dataset paths reach duckdb as bound parameters, never as SQL text."""

from __future__ import annotations

import shutil

import pytest

from tests.features.conftest import tiny_cfg


@pytest.mark.parametrize("name", ["o'brien", "x'); DROP TABLE users; --", "it's'; SELECT 1; --"])
def test_paths_with_quotes_build_the_same_features(tiny_dataset, tiny_features, tmp_path, name):
    from gem.data.contract import Manifest
    from gem.features.build import build_features
    from gem.features.feast_sources import attribute_time, recent_behavior
    from gem.features.plan import to_us
    from gem.features.vocab import build_vocabularies

    data = tmp_path / name / "data"
    shutil.copytree(tiny_dataset, data, ignore=shutil.ignore_patterns("_validation", ".gem-output"))
    end = to_us(Manifest.read(data).end)
    assert {k: v.to_pylist() for k, v in build_vocabularies(data, end, 1).values.items()} == \
        {k: v.to_pylist() for k, v in build_vocabularies(tiny_dataset, end, 1).values.items()}
    assert attribute_time(data) == attribute_time(tiny_dataset)
    assert recent_behavior(data, 3).equals(recent_behavior(tiny_dataset, 3))
    if name == "o'brien":  # the whole build, output folder quoted too
        manifest = build_features(data, tmp_path / name / "features", tiny_cfg(max_seq_len=8, num_buckets=1, workers=1))
        import json

        assert manifest["digest"] == json.loads((tiny_features / "manifest.json").read_text())["digest"]
