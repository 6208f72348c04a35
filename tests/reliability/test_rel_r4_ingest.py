"""Issue 42 item 5: the pipeline's ingest refuses a dataset whose quarantine exceeds the
allowed share as a refusal of the user's data (one line, exit 2 through the step-refusal
path), naming the share, the limit and the file listing each row with its reason."""

from __future__ import annotations

import shutil

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from gem.data.contract import Manifest, day_dir, event_files
from gem.errors import is_user_error


def test_a_quarantine_over_the_limit_is_a_refusal_naming_the_rows_file(tiny_dataset, tmp_path):
    from gem_app.stages.context import RunContext
    from gem_app.stages.ingest import validate

    data = tmp_path / "ds"
    shutil.copytree(tiny_dataset, data, ignore=shutil.ignore_patterns("_validation", ".gem-output"))
    bad = pq.read_table(event_files(data)[0]).slice(0, 3)
    bad = bad.set_column(bad.schema.get_field_index("click"), "click", pc.cast(pa.array([2, 2, 2]), pa.int8()))
    pq.write_table(bad, day_dir(data, Manifest.read(data).start.date()) / "bad.parquet")
    ctx = RunContext(pipeline_run_id="ingest-test", tracking_root=str(tmp_path / "ws"))
    with pytest.raises(Exception) as refused:
        validate(str(data), str(tmp_path / "clean"), str(tmp_path / "report"), ctx, max_quarantine_fraction=0.0)
    assert is_user_error(refused.value), type(refused.value)
    assert "of rows quarantined, above the allowed 0.0000%" in str(refused.value)
    assert "quarantine" in str(refused.value).rsplit(": ", 1)[-1]  # where each row and its reason are
