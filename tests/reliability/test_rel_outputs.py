"""Defect 6: commands write only into new or owned folders, never over their inputs."""

from __future__ import annotations

import pytest

from gem.data.contract import MANIFEST
from gem.utils.outputs import OutputFolderError, check_output, claim_output, owner


def test_features_build_into_its_own_input_is_refused_and_the_dataset_survives(tiny_dataset):
    from gem.features.build import build_features
    from tests.features.conftest import tiny_cfg

    before = (tiny_dataset / MANIFEST).read_bytes()
    with pytest.raises(OutputFolderError, match="is the input"):
        build_features(tiny_dataset, tiny_dataset, tiny_cfg())
    with pytest.raises(OutputFolderError, match="inside the input"):
        build_features(tiny_dataset, tiny_dataset / "features", tiny_cfg())
    assert (tiny_dataset / MANIFEST).read_bytes() == before
    assert not (tiny_dataset / "features").exists() and owner(tiny_dataset) == "dataset"


def test_a_foreign_non_empty_folder_is_refused_and_kept(tiny_dataset, tmp_path):
    from gem.features.build import build_features
    from tests.features.conftest import tiny_cfg

    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "thesis.txt").write_text("years of work")
    with pytest.raises(OutputFolderError, match="not written by gem"):
        build_features(tiny_dataset, notes, tiny_cfg())
    assert sorted(p.name for p in notes.iterdir()) == ["thesis.txt"]


def test_claim_rules():
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        new = claim_output(root / "a", "features")
        assert owner(new) == "features"
        claim_output(root / "a", "features")  # owned: accepted again
        (new / "x").write_text("")
        with pytest.raises(OutputFolderError, match="holds a 'features' output"):
            check_output(new, "knowledge")
        (root / "empty").mkdir()
        assert check_output(root / "empty", "knowledge") == (root / "empty").resolve()
        with pytest.raises(OutputFolderError, match="contains the input"):
            check_output(root, "knowledge", inputs=[root / "empty"])
        check_output(root / "b", "knowledge", inputs=["models:/teacher/1", "runs:/abc/model"])


def test_knowledge_generate_refuses_a_foreign_folder_and_replaces_its_own(tiny_features, tiny_teacher, tmp_path):
    from gem.knowledge.config import KnowledgeConfig
    from gem.knowledge.generate import MANIFEST as KNOWLEDGE_MANIFEST
    from gem.knowledge.generate import generate_knowledge

    cfg = KnowledgeConfig(batch_size=256)
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "thesis.txt").write_text("years of work")
    with pytest.raises(OutputFolderError, match="not written by gem"):
        generate_knowledge(tiny_teacher, tiny_features, notes, cfg)
    assert (notes / "thesis.txt").read_text() == "years of work"

    out = tmp_path / "k"
    generate_knowledge(tiny_teacher, tiny_features, out, cfg)
    assert owner(out) == "knowledge" and (out / KNOWLEDGE_MANIFEST).is_file()
    (out / "stale.txt").write_text("from an earlier run")
    generate_knowledge(tiny_teacher, tiny_features, out, cfg)  # its own output: replaced whole
    assert not (out / "stale.txt").exists() and owner(out) == "knowledge"
    with pytest.raises(OutputFolderError, match="is the input"):
        generate_knowledge(tiny_teacher, tiny_features, tiny_features, cfg)


def test_validate_out_and_simulate_refuse_foreign_folders(tiny_dataset, tmp_path):
    from gem.data.simulate import SimulatorConfig, simulate
    from gem.data.validate import validate_dataset

    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "thesis.txt").write_text("years of work")
    with pytest.raises(OutputFolderError):
        validate_dataset(tiny_dataset, report_dir=tmp_path / "r", out=notes)
    with pytest.raises(OutputFolderError, match="is the input"):
        validate_dataset(tiny_dataset, report_dir=tmp_path / "r", out=tiny_dataset)
    with pytest.raises(OutputFolderError):
        simulate(SimulatorConfig(users=20, items=60, days=1, topics=8), notes, progress=False)
    assert sorted(p.name for p in notes.iterdir()) == ["thesis.txt"]
