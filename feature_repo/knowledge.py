"""Teacher knowledge: GEM's per-impression predictions and its user/item embeddings.

Written by ``python -m gem knowledge generate`` (gem/knowledge/), copied into
``data/teacher_*.parquet`` by ``python -m gem knowledge register``. Every row carries the
teacher's model version and the data window it was computed on, so a student can tell
which teacher it learned from and how stale that teacher is.

- ``teacher_predictions`` (offline only): one row per impression, keyed by the impression
  (``example_id`` = contract event_id), stamped at the impression's event time: the
  teacher's joint logits on the impression's own surface and on every surface.
- ``teacher_user_embedding`` / ``teacher_item_embedding`` (online too): the two-tower
  embeddings, one row per (entity, impression time). Students read them point-in-time
  as precomputed input features (representation transfer) and at serving time from the
  online store, so GEM never runs at serving time.
"""

from datetime import timedelta

from feast import Entity, FeatureService, FeatureView, Field, FileSource, ValueType
from feast.types import Array, Float32, String

from entities import item, user
from features import item_attributes, user_attributes, user_recent_behavior

SURFACE_NAMES = ("feed", "video", "stories", "messaging")  # gem.data.contract.SURFACES
TASK_NAMES = ("click", "conversion")  # gem.data.contract.TASKS

impression = Entity(name="impression", join_keys=["example_id"], value_type=ValueType.INT64,
                    description="One ad impression (contract events.event_id).")

teacher_predictions_source = FileSource(
    name="teacher_predictions_source",
    path="data/teacher_predictions.parquet",
    timestamp_field="event_timestamp",
    description="GEM joint logits per impression (gem.knowledge.generate).",
)

teacher_user_embedding_source = FileSource(
    name="teacher_user_embedding_source",
    path="data/teacher_user_embedding.parquet",
    timestamp_field="event_timestamp",
    description="GEM user-tower embedding per (user, impression time).",
)

teacher_item_embedding_source = FileSource(
    name="teacher_item_embedding_source",
    path="data/teacher_item_embedding.parquet",
    timestamp_field="event_timestamp",
    description="GEM item-tower embedding per (item, impression time).",
)

_TAGS = [Field(name="teacher_version", dtype=String), Field(name="window_start", dtype=String),
         Field(name="window_end", dtype=String)]

teacher_predictions = FeatureView(
    name="teacher_predictions",
    entities=[impression],
    ttl=timedelta(0),
    schema=[
        Field(name="teacher_logit_click", dtype=Float32),
        Field(name="teacher_logit_conversion", dtype=Float32),
        *[Field(name=f"teacher_logit_{s}_{t}", dtype=Float32) for s in SURFACE_NAMES for t in TASK_NAMES],
        *_TAGS,
    ],
    source=teacher_predictions_source,
    online=False,
    tags={"kind": "knowledge", "note": "training targets only; never served"},
)

teacher_user_embedding = FeatureView(
    name="teacher_user_embedding",
    entities=[user],
    ttl=timedelta(days=30),
    schema=[Field(name="teacher_user_embedding", dtype=Array(Float32)), *_TAGS],
    source=teacher_user_embedding_source,
    online=True,
    tags={"kind": "knowledge"},
)

teacher_item_embedding = FeatureView(
    name="teacher_item_embedding",
    entities=[item],
    ttl=timedelta(days=30),
    schema=[Field(name="teacher_item_embedding", dtype=Array(Float32)), *_TAGS],
    source=teacher_item_embedding_source,
    online=True,
    tags={"kind": "knowledge"},
)

student_knowledge_v1 = FeatureService(
    name="student_knowledge_v1",
    features=[user_attributes, item_attributes, user_recent_behavior,
              teacher_user_embedding, teacher_item_embedding],
    tags={"model": "vertical_student", "note": "serving inputs of the distilled per-surface students"},
)
