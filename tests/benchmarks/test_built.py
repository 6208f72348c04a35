"""Benchmarks reuse generated folders by content only (benchmarks.results.built)."""

from pathlib import Path

import pytest

from benchmarks.results import built


class Builder:
    def __init__(self, text: str = "a"):
        self.text, self.calls = text, 0

    def __call__(self, out: Path) -> None:
        self.calls += 1
        out.mkdir(parents=True)
        (out / "part.txt").write_text(f"{self.text}{self.calls}")


def test_same_key_reuses_the_folder(tmp_path):
    make = Builder()
    first = built(tmp_path / "d", {"x": 1}, make)
    assert built(tmp_path / "d", {"x": 1}, make) == first
    assert make.calls == 1 and (tmp_path / "d" / "part.txt").read_text() == "a1"


def test_a_folder_that_merely_exists_is_rebuilt(tmp_path):
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "stale.txt").write_text("from another run")
    make = Builder()
    built(tmp_path / "d", {"x": 1}, make)
    assert make.calls == 1 and sorted(p.name for p in (tmp_path / "d").iterdir()) == ["part.txt"]


@pytest.mark.parametrize("change", ["key", "content", "code", "fresh", "record_lost"])
def test_a_changed_input_output_or_code_rebuilds(tmp_path, monkeypatch, change):
    make = Builder()
    first = built(tmp_path / "d", {"x": 1}, make)
    key, fresh = {"x": 1}, False
    if change == "key":
        key = {"x": 2}
    elif change == "content":
        (tmp_path / "d" / "part.txt").write_text("edited")
    elif change == "code":
        monkeypatch.setattr("gem.utils.digest.code_version", lambda: "other code")
    elif change == "fresh":
        fresh = True
    else:
        (tmp_path / ".d.built.json").unlink()
    second = built(tmp_path / "d", key, make, fresh=fresh)
    assert make.calls == 2 and second != first and (tmp_path / "d" / "part.txt").read_text() == "a2"


def test_a_failed_build_leaves_nothing_reusable(tmp_path):
    def fail(out: Path) -> None:
        out.mkdir()
        (out / "half.txt").write_text("partial")
        raise RuntimeError("killed")

    with pytest.raises(RuntimeError):
        built(tmp_path / "d", {"x": 1}, fail)
    make = Builder()
    built(tmp_path / "d", {"x": 1}, make)
    assert make.calls == 1 and sorted(p.name for p in (tmp_path / "d").iterdir()) == ["part.txt"]
