"""One dataset handle per stage: the manifest read once, the tree walked once
(issue 30, item 5), and every digest equal to the path-based one it replaces."""

from __future__ import annotations

import collections
import shutil

import pytest

import gem.data.contract as contract
import gem.utils.digest as digest
from gem.data.contract import DatasetHandle, Manifest
from gem.data.validate import REPORT_DIR, dataset_stamp, validate_dataset
from gem.utils.digest import tree_digest


@pytest.fixture(scope="module")
def clean_dataset(tiny_dataset, tmp_path_factory):
    """The tiny simulator dataset written clean (stamped) by the validator, as ingest leaves it."""
    out = tmp_path_factory.mktemp("handle") / "clean"
    validate_dataset(tiny_dataset, out=out)
    return out


def test_handle_digests_equal_the_path_digests(clean_dataset):
    handle = DatasetHandle.open(clean_dataset)
    assert DatasetHandle.open(handle) is handle
    assert handle.manifest == Manifest.read(clean_dataset)
    assert handle.digest == tree_digest(clean_dataset)
    assert handle.digest_excluding(("manifest.json", REPORT_DIR)) == tree_digest(
        clean_dataset, exclude=("manifest.json", REPORT_DIR))
    assert dataset_stamp(handle) == dataset_stamp(clean_dataset)
    assert handle.manifest.extra["validation"]["digest"] == dataset_stamp(handle)


def test_a_validation_of_a_handle_leaves_its_manifest_alone(tiny_dataset, tmp_path):
    handle = DatasetHandle.open(tiny_dataset)
    before = dict(handle.manifest.extra)
    validate_dataset(handle, report_dir=tmp_path / "report", out=tmp_path / "clean")
    assert handle.manifest.extra == before  # the copy written to the output got validated_from
    assert Manifest.read(tmp_path / "clean").extra["validated_from"] == str(handle.root)


@pytest.fixture
def reads(monkeypatch):
    """Counts of manifest file reads and tree walks, by the function that asked."""
    counts: collections.Counter = collections.Counter()
    read_json, walk = contract.read_manifest_json, digest.tree_files

    def counted_read(directory):
        counts["manifest"] += 1
        return read_json(directory)

    def counted_walk(root, **kw):
        counts["walk"] += 1
        return walk(root, **kw)

    monkeypatch.setattr(contract, "read_manifest_json", counted_read)
    monkeypatch.setattr(digest, "tree_files", counted_walk)
    return counts


@pytest.mark.parametrize("stamped", [True, False], ids=["stamped", "unstamped"])
def test_features_plan_reads_the_manifest_and_digests_the_tree_once(stamped, clean_dataset, tiny_dataset, tmp_path,
                                                                    reads):
    from gem_app.stages.features import features_plan

    data = clean_dataset if stamped else tmp_path / "raw"
    if not stamped:
        shutil.copytree(tiny_dataset, data)
    shards = features_plan(str(data), str(tmp_path / "features"), "2026-01-03T00:00:00+00:00",
                           "2026-01-04T00:00:00+00:00", "smoke")
    assert shards
    # before the handle: 5 manifest reads and 2 walks on a stamped dataset (issue 30)
    assert reads == {"manifest": 1, "walk": 1}
