"""Knowledge generation: a frozen GEM teacher's outputs over a features window.

    manifest = generate_knowledge("models:/gem-teacher@prod", "features/", "knowledge/")

Output (written into a hidden temp folder and renamed into place, so a reader sees the
whole result or none; ``knowledge.json`` is written last). ``out_dir`` must be new,
empty or an earlier knowledge output (gem.utils.outputs): a folder of anything else is
refused, never emptied.

    OUT/predictions.parquet     one row per impression: example_id, user_id, item_id (raw
                                ids), surface, event_timestamp, teacher_logit_{click,conversion}
                                (own surface), teacher_logit_<surface>_<task> (every surface),
                                tags: teacher_version, window_start, window_end,
                                teacher_digest (sha256 of its weights), vocab_digest
                                (its vocabularies: students check both, students/lineage.py)
    OUT/user_embedding.parquet  user_id, event_timestamp (the impression's), teacher_user_embedding
                                (E floats), tags
    OUT/item_embedding.parquet  item_id, event_timestamp (= window start: the item tower reads
                                item attributes only), teacher_item_embedding (E floats), tags
    OUT/knowledge.json          teacher uri/version/digest, vocab_digest, window, counts,
                                examples/s, schema

Logits are GEM's joint logits (column 1 is p(click and conversion)), see gem.model.heads.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import torch

from gem.data.contract import SURFACES, TASKS, parse_utc
from gem.features.loader import FeatureLoader, read_manifest
from gem.features.storage import atomic_dir, write_json_atomic, write_parquet
from gem.knowledge.config import KnowledgeConfig
from gem.knowledge.teacher import Teacher, load_teacher, teacher_outputs
from gem.knowledge.windows import example_keys, select_shards, window_bounds
from gem.protocol import Split, WindowError
from gem.training.threads import ThreadTuner, thread_tuner
from gem.utils.outputs import check_output, json_format, write_marker
from gem.utils.progress import Progress

log = logging.getLogger(__name__)

FORMAT = "gem-knowledge/1"
MANIFEST = "knowledge.json"
OUTPUT_KIND = "knowledge"
PREDICTIONS, USER_EMBEDDING, ITEM_EMBEDDING = "predictions.parquet", "user_embedding.parquet", "item_embedding.parquet"


def own_columns(tasks) -> tuple[str, ...]:
    """The own-surface joint logit columns of the data's tasks."""
    return tuple(f"teacher_logit_{t}" for t in tasks)


def surface_columns(surfaces, tasks) -> tuple[str, ...]:
    """Every surface's joint logit columns, surface-major (reshape to (N, S, T))."""
    return tuple(f"teacher_logit_{s}_{t}" for s in surfaces for t in tasks)


# the columns the Feast view declares (feature_repo/knowledge.py: the contract's default
# vocabulary); a table always carries them, NaN where the data has no such surface or task
OWN_COLUMNS = own_columns(TASKS)
SURFACE_COLUMNS = surface_columns(SURFACES, TASKS)
# every row's lineage: the teacher's version, its weights' digest (the teacher itself: a
# version name like models:/gem_teacher/1 repeats in every store) and its vocabularies'
# digest (the dataset its ids come from), and the window; students record and check them
TAG_COLUMNS = ("teacher_version", "window_start", "window_end", "teacher_digest", "vocab_digest")


def knowledge_vocab_digest(digests: dict[str, str]) -> str:
    """The ``vocab_digest`` tag: gem.features.vocab.vocabulary_digest, "" when not recorded."""
    from gem.features.vocab import vocabulary_digest

    return vocabulary_digest(digests) if digests else ""


def _check_spec(teacher: Teacher, loader: FeatureLoader) -> None:
    from gem.features.vocab import check_vocabularies

    check_vocabularies(teacher.spec.vocab_digests, loader.spec.vocab_digests, model=f"the teacher {teacher.version}",
                       window=str(loader.features_dir))
    t, d = teacher.spec.to_dict(), loader.spec.to_dict()
    diff = sorted(k for k in t if k not in ("max_seq_len", "vocab_digests") and t[k] != d.get(k))
    if diff:
        raise ValueError(f"the teacher was trained on another feature spec than {loader.features_dir}: "
                         f"{diff} differ (build the window with the teacher's vocabularies: vocab_from)")


@torch.no_grad()
def run_teacher(teacher: Teacher, loader: FeatureLoader, precision: str = "fp32",
                tuner: ThreadTuner | None = None) -> dict[str, np.ndarray]:
    """Teacher outputs per impression, in loader order: example_id (N,), own (N, T),
    all (N, S, T), user (N, E), item (N, E). ``tuner``: picks torch's threads by timing
    the batches (gem/training/threads.py)."""
    parts: dict[str, list[np.ndarray]] = {k: [] for k in ("example_id", "own", "all", "user", "item")}
    model = teacher.model.eval()
    bar = Progress(len(loader), f"teacher on {Path(loader.features_dir).name}", unit="batch")
    for batch in loader:
        ctx = (torch.autocast("cpu", dtype=torch.bfloat16) if precision == "bf16"
               else torch.autocast("cpu", enabled=False))
        if tuner is not None:
            tuner.before_step()
        started = time.perf_counter()
        with ctx:
            own, every, user, item = teacher_outputs(model, batch)
        if tuner is not None:
            tuner.after_step(time.perf_counter() - started, batch.batch_size)
        parts["example_id"].append(batch.example_id.numpy())
        for key, value in (("own", own), ("all", every), ("user", user), ("item", item)):
            parts[key].append(value.float().numpy())
        bar.update()
    bar.close()
    return {k: np.concatenate(v) if v else np.zeros((0,)) for k, v in parts.items()}


def _list_column(matrix: np.ndarray) -> pa.Array:
    if matrix.size == 0:  # a window without impressions: no rows, whatever the width
        return pa.array([], pa.list_(pa.float32()))
    matrix = np.ascontiguousarray(matrix, dtype=np.float32)
    n, e = matrix.shape
    offsets = pa.array(np.arange(0, (n + 1) * e, e, dtype=np.int32))
    return pa.ListArray.from_arrays(offsets, pa.array(matrix.reshape(-1)))


def knowledge_tables(out: dict[str, np.ndarray], keys: pd.DataFrame, tags: dict[str, str],
                     surfaces=SURFACES, tasks=TASKS) -> dict[str, pa.Table]:
    """The three output tables from teacher outputs and the impressions' keys; logit
    columns for the data's ``surfaces`` x ``tasks`` (the teacher's spec), plus the Feast
    view's fixed columns (NaN where the data lacks that surface or task)."""
    order = pd.Series(np.arange(len(out["example_id"])), index=out["example_id"])
    keys = keys[keys["example_id"].isin(order.index)].reset_index(drop=True)
    idx = order.loc[keys["example_id"].to_numpy()].to_numpy()
    n = len(keys)
    tag_cols = {k: pa.array([v] * n, pa.string()) for k, v in tags.items()}
    ts = pa.array(keys["event_timestamp"], pa.timestamp("us", tz="UTC"))
    own_cols, surface_cols = own_columns(tasks), surface_columns(surfaces, tasks)
    # explicit widths: a window without impressions gives 1-D empty outputs
    own = out["own"][idx].reshape(n, len(own_cols))
    every = out["all"][idx].reshape(n, len(surface_cols))
    logits = {c: own[:, i] for i, c in enumerate(own_cols)}
    logits.update({c: every[:, i] for i, c in enumerate(surface_cols)})
    nan = np.full(n, np.nan, dtype=np.float32)
    fixed = {c: logits.pop(c, nan) for c in (*OWN_COLUMNS, *SURFACE_COLUMNS)}
    predictions = pa.table({
        "example_id": pa.array(keys["example_id"], pa.int64()),
        "user_id": pa.array(keys["user_id"], pa.int64()),
        "item_id": pa.array(keys["item_id"], pa.int64()),
        "surface": pa.array(np.asarray(list(surfaces), dtype=object)[keys["surface"].to_numpy()], pa.string()),
        "event_timestamp": ts,
        **{c: pa.array(v, pa.float32()) for c, v in fixed.items()},
        **{c: pa.array(v, pa.float32()) for c, v in logits.items()},  # the data's other surfaces
        **tag_cols,
    })
    tables = {PREDICTIONS: predictions}
    for side, name in (("user", USER_EMBEDDING), ("item", ITEM_EMBEDDING)):
        key = f"{side}_id"
        frame = pd.DataFrame({key: keys[key].to_numpy(), "ts": keys["event_timestamp"], "row": idx})
        frame = frame[frame[key] >= 0]
        if side == "item":  # the item tower reads item attributes only: one row per item, at the window start
            frame = frame.drop_duplicates(key, keep="last").assign(ts=pd.Timestamp(tags["window_start"]))
        frame = frame.drop_duplicates([key, "ts"], keep="last").sort_values([key, "ts"])
        m = len(frame)
        tables[name] = pa.table({
            key: pa.array(frame[key].to_numpy(), pa.int64()),
            "event_timestamp": pa.array(frame["ts"], pa.timestamp("us", tz="UTC")),
            f"teacher_{side}_embedding": _list_column(out[side][frame["row"].to_numpy()]),
            **{k: pa.array([v] * m, pa.string()) for k, v in tags.items()},
        })
    return tables


def _narrowed(features_dir: str | Path, start: str, end: str) -> dict:
    """Loader options that keep only the examples in [start, end) when that is narrower
    than the build's window (a wide shard spans days on both sides of it)."""
    if (start, end) == window_bounds(features_dir):
        return {}
    cuts = tuple(int(parse_utc(t).timestamp() * 1_000_000) for t in (start, end))
    return {"split": Split(cuts=cuts), "part": "validation"}  # the middle part: [start, end)


def generate_knowledge(model: str | Path | Teacher, features_dir: str | Path, out_dir: str | Path,
                       cfg: KnowledgeConfig | None = None, *, start: str | None = None, end: str | None = None,
                       shards: list[str] | None = None, tracking_uri: str | None = None,
                       tuner: ThreadTuner | None = None) -> dict:
    """Run the teacher over the window ``features_dir`` [start, end) (or exactly the
    named ``shards``) and write its knowledge to ``out_dir`` (see module docstring);
    returns the manifest. ``tuner``: one shared by the calls over several windows (its
    trial steps, some with the slower thread count, then happen once); default: a new
    one per call, as ``cfg.threads`` says."""
    cfg = (cfg or KnowledgeConfig()).validate()
    local_model = [] if isinstance(model, Teacher) else [model]
    check_output(out_dir, OUTPUT_KIND, inputs=[features_dir, *local_model],
                 legacy=json_format(MANIFEST, "gem-knowledge/"))
    tuner = tuner or thread_tuner(cfg.threads)
    shards = select_shards(features_dir, start, end) if shards is None else list(shards)
    w_start, w_end = window_bounds(features_dir, start, end)
    if not shards or parse_utc(w_start) >= parse_utc(w_end):  # before the teacher is loaded
        window = read_manifest(features_dir)["window"]
        raise WindowError(f"{features_dir}: no example in [{start or window['start']}, {end or window['end']}): the "
                          f"window is [{window['start']}, {window['end']}); choose --start/--end inside it")
    teacher = model if isinstance(model, Teacher) else load_teacher(model, tracking_uri)
    if cfg.compile:
        from gem.training.compile_cache import COMPILE_CACHE, use_compile_cache
        from gem.training.parallelize import apply_compile

        use_compile_cache(Path(out_dir).resolve().parent / COMPILE_CACHE)
        apply_compile(teacher.model)
    loader = FeatureLoader(features_dir, batch_size=cfg.batch_size, shuffle=False, shards=shards,
                           **_narrowed(features_dir, w_start, w_end))
    _check_spec(teacher, loader)
    tags = {"teacher_version": teacher.version, "window_start": w_start, "window_end": w_end,
            "teacher_digest": teacher.digest, "vocab_digest": knowledge_vocab_digest(teacher.spec.vocab_digests)}
    started = time.perf_counter()
    threads = torch.get_num_threads()
    try:
        out = run_teacher(teacher, loader, cfg.precision, tuner)
    finally:
        torch.set_num_threads(threads)  # the tuner's choice was for these batches only
    seconds = time.perf_counter() - started
    spec = loader.spec
    tables = knowledge_tables(out, example_keys(features_dir, shards), tags, spec.surfaces, spec.tasks)
    if not cfg.embeddings:
        tables = {PREDICTIONS: tables[PREDICTIONS]}
    n = tables[PREDICTIONS].num_rows
    manifest = {
        "format": FORMAT, "teacher_uri": str(teacher.uri), "teacher_version": teacher.version,
        "teacher_run_id": teacher.run_id, "teacher_digest": teacher.digest, "vocab_digest": tags["vocab_digest"],
        "window": {"start": w_start, "end": w_end},
        "features": {"dir": str(Path(features_dir).resolve()), "digest": read_manifest(features_dir)["digest"],
                     "shards": shards},
        "counts": {"examples": n, **{name: t.num_rows for name, t in tables.items()}},
        "embedding_dim": int(out["user"].shape[1]) if n else 0,
        "surfaces": list(spec.surfaces), "tasks": list(spec.tasks),
        "columns": {"own": list(own_columns(spec.tasks)), "surfaces": list(surface_columns(spec.surfaces, spec.tasks))},
        "examples_per_s": n / seconds if seconds > 0 else 0.0,
        "created": dt.datetime.now(dt.timezone.utc).isoformat(),
        "schema": {name: [f.name for f in t.schema] for name, t in tables.items()},
    }
    with atomic_dir(Path(out_dir)) as tmp:
        for name, table in tables.items():
            write_parquet(table, tmp / name)
        write_json_atomic(manifest, tmp / MANIFEST)
        write_marker(tmp, OUTPUT_KIND)
    log.info("knowledge: %d impressions at %.0f examples/s -> %s", n, manifest["examples_per_s"], out_dir)
    return manifest


def read_knowledge_manifest(knowledge_dir: str | Path) -> dict:
    path = Path(knowledge_dir) / MANIFEST
    if not path.is_file():
        raise FileNotFoundError(f"{path}: missing; not a finished knowledge folder (run `gem knowledge generate`)")
    manifest = json.loads(path.read_text())
    if manifest.get("format") != FORMAT:
        raise ValueError(f"{path}: format {manifest.get('format')!r}, expected {FORMAT}")
    return manifest
