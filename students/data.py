"""StudentTable: a features window held in memory as plain tensors, with the teacher's
knowledge joined per impression (point-in-time, through Feast).

Shapes: N impressions, F student sparse features, h history items, D dense features,
S surfaces, T = 2 tasks, E teacher embedding width (user + item).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from pathlib import Path

import numpy as np
import torch

from gem.data.batch import FeatureSpec
from gem.data.contract import SURFACES, TASKS
from gem.features.loader import FeatureLoader, read_manifest
from gem.knowledge.generate import own_columns, surface_columns
from gem.knowledge.windows import example_keys
from students.config import StudentModelConfig
from students.model import StudentInputs

HISTORY_KEY = "seq_item_id"


@dataclass
class StudentTable:
    sparse: torch.Tensor  # int64 (N, F)
    history: torch.Tensor  # int64 (N, h), most recent last, 0 = padding
    dense: torch.Tensor  # float32 (N, D)
    surface: torch.Tensor  # int64 (N,)
    labels: torch.Tensor  # float32 (N, T): click, click-and-conversion
    example_id: torch.Tensor  # int64 (N,)
    event_time_us: torch.Tensor  # int64 (N,)
    user_raw: torch.Tensor  # int64 (N,) contract user id
    item_raw: torch.Tensor  # int64 (N,) contract item id (-1: outside the vocabulary)
    teacher_logits: torch.Tensor | None = None  # float32 (N, T) own-surface joint logits
    teacher_all: torch.Tensor | None = None  # float32 (N, S, T)
    teacher_emb: torch.Tensor | None = None  # float32 (N, E)
    teacher_version: str = ""
    # the Feast store's knowledge lineage (students/lineage.py knowledge_record): what a
    # student trained on these rows records
    knowledge: dict = field(default_factory=dict)
    # [start_us, end_us) of the time window the rows were cut from (the features build's
    # window, or a split of it): the adapter's "newest periods" end at end_us
    window_us: tuple[int, int] | None = None
    # the data's surfaces and tasks (the features spec): what surface ids and label columns mean
    surfaces: tuple[str, ...] = SURFACES
    tasks: tuple[str, ...] = TASKS

    def __len__(self) -> int:
        return int(self.surface.shape[0])

    def subset(self, index: torch.Tensor) -> "StudentTable":
        """Rows ``index`` (a bool mask or int positions)."""
        out = {}
        for f in fields(self):
            value = getattr(self, f.name)
            out[f.name] = value[index] if isinstance(value, torch.Tensor) else value
        return StudentTable(**out)

    def inputs(self, index: torch.Tensor | slice | None = None) -> StudentInputs:
        sel = slice(None) if index is None else index
        return StudentInputs(sparse=self.sparse[sel], history=self.history[sel], dense=self.dense[sel],
                             surface=self.surface[sel],
                             teacher_emb=None if self.teacher_emb is None else self.teacher_emb[sel])


def last_items(values: np.ndarray, lengths: np.ndarray, h: int) -> np.ndarray:
    """(B, h) the last ``h`` values of each jagged row, right-aligned, 0-padded."""
    out = np.zeros((len(lengths), h), dtype=np.int64)
    ends = np.cumsum(lengths)
    for j in range(h):  # position h-1-j holds the j-th most recent item
        pos = ends - 1 - j
        ok = lengths > j
        out[ok, h - 1 - j] = values[pos[ok]]
    return out


def load_table(features_dir: str | Path, cfg: StudentModelConfig, *, shards: list[str] | None = None,
               batch_size: int = 4096) -> tuple[StudentTable, FeatureSpec]:
    """Every impression of the window (in loader order) as a StudentTable."""
    loader = FeatureLoader(features_dir, batch_size=batch_size, shuffle=False, shards=shards)
    spec = loader.spec
    missing = [k for k in cfg.sparse_features if k not in spec.sparse] + \
        [k for k in cfg.dense_features if k not in spec.dense]
    if missing:
        raise ValueError(f"student features {missing} are not in the window's spec "
                         f"(sparse {list(spec.sparse)}, dense {spec.dense})")
    dense_idx = [spec.dense.index(k) for k in cfg.dense_features]
    sparse_idx = [list(spec.sparse).index(k) for k in cfg.sparse_features]
    history_row = list(spec.sequence).index(HISTORY_KEY)
    parts: dict[str, list] = {k: [] for k in ("sparse", "history", "dense", "surface", "labels", "example_id")}
    for arrays in loader.iter_arrays():  # plain tensors: the students never need torchrec
        parts["sparse"].append(arrays["sparse"][:, sparse_idx])
        parts["history"].append(torch.from_numpy(last_items(arrays["sequence"][history_row].numpy(),
                                                            arrays["lengths"].numpy(), cfg.history_len)))
        parts["dense"].append(arrays["dense"][:, dense_idx])
        for k in ("surface", "labels", "example_id"):
            parts[k].append(arrays[k])
    cat = {k: torch.cat(v) if v else torch.zeros(0) for k, v in parts.items()}
    keys = example_keys(features_dir, shards).set_index("example_id").loc[cat["example_id"].numpy()]
    time_us = keys["event_timestamp"].astype("int64").to_numpy() // 1000  # ns -> us
    table = StudentTable(
        sparse=cat["sparse"].long(), history=cat["history"].long(), dense=cat["dense"].float(),
        surface=cat["surface"].long(), labels=cat["labels"].float(), example_id=cat["example_id"].long(),
        event_time_us=torch.from_numpy(time_us.astype(np.int64)),
        user_raw=torch.from_numpy(keys["user_id"].to_numpy().astype(np.int64)),
        item_raw=torch.from_numpy(keys["item_id"].to_numpy().astype(np.int64)),
        surfaces=tuple(spec.surfaces), tasks=tuple(spec.tasks),
    )
    window = read_manifest(features_dir).get("window") or {}
    if window.get("start") and window.get("end"):
        table.window_us = (_us(window["start"]), _us(window["end"]))
    return table, spec


def _us(iso: str) -> int:
    from gem.data.contract import parse_utc

    return int(round(parse_utc(iso).timestamp() * 1e6))


def split_at(table: StudentTable, at_us: int) -> tuple[StudentTable, StudentTable]:
    """(rows before ``at_us``, rows from ``at_us``), each with its own window."""
    lo, hi = table.window_us or (int(table.event_time_us.min()), int(table.event_time_us.max()) + 1)
    before, after = table.subset(table.event_time_us < at_us), table.subset(table.event_time_us >= at_us)
    before.window_us, after.window_us = (lo, at_us), (at_us, hi)
    return before, after


def keys_frame(table: StudentTable):
    import pandas as pd

    return pd.DataFrame({
        "example_id": table.example_id.numpy(), "user_id": table.user_raw.numpy(),
        "item_id": table.item_raw.numpy(),
        "event_timestamp": pd.to_datetime(table.event_time_us.numpy(), unit="us", utc=True),
    })


def attach_knowledge(table: StudentTable, repo_dir: str | Path, *, predictions: bool = True,
                     embeddings: bool = True, refresh_every: str = "1d", lineage: bool = True) -> StudentTable:
    """The table with the teacher's knowledge from the Feast repo (point-in-time). Rows
    the teacher never scored keep NaN logits (the losses skip them). Embeddings are read
    as of the last materialization before each impression (``refresh_every``, the
    knowledge cadence; ``"impression"``: the row just before it, an upper bound).
    ``lineage``: note the store's knowledge lineage on the table (``knowledge``, what a
    student trained on it records; its content digest reads the knowledge tables whole,
    so scoring, which only checks it, leaves it out)."""
    from gem.knowledge.feast import historical_knowledge
    from students.config import refresh_interval
    from students.lineage import knowledge_record

    frame = historical_knowledge(repo_dir, keys_frame(table), predictions=predictions, embeddings=embeddings,
                                 refresh_every=refresh_interval(refresh_every))
    out = replace(table, knowledge=knowledge_record(repo_dir) if lineage else {})
    if predictions:
        surfaces, tasks = table.surfaces, table.tasks
        # columns the Feast view does not declare (a surface outside its fixed vocabulary) read as unknown (NaN)
        own = frame.reindex(columns=list(own_columns(tasks))).to_numpy(dtype=np.float32)
        every = frame.reindex(columns=list(surface_columns(surfaces, tasks))).to_numpy(dtype=np.float32).reshape(
            len(frame), -1, len(tasks))
        out.teacher_logits, out.teacher_all = torch.from_numpy(own), torch.from_numpy(every)
        versions = sorted({v for v in frame["teacher_version"] if isinstance(v, str)})
        out.teacher_version = ",".join(versions)
    if embeddings:
        user = np.stack(frame["teacher_user_embedding"].to_list()).astype(np.float32)
        item = np.stack(frame["teacher_item_embedding"].to_list()).astype(np.float32)
        out.teacher_emb = torch.from_numpy(np.concatenate([user, item], axis=1))
    return out
