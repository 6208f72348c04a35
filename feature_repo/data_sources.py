"""Offline sources: Parquet files written by gem.features.feast_sources.export.

Paths are relative to the repo directory. Static attributes carry one row per entity
stamped ``event_timestamp`` = 1 second before the dataset's first event, so every
point-in-time lookup inside the dataset finds them and none finds a later row.
"""

from feast import FileSource

user_attributes_source = FileSource(
    name="user_attributes_source",
    path="data/user_attributes.parquet",
    timestamp_field="event_timestamp",
    description="users.parquet of a contract dataset, one row per user.",
)

item_attributes_source = FileSource(
    name="item_attributes_source",
    path="data/item_attributes.parquet",
    timestamp_field="event_timestamp",
    description="items.parquet of a contract dataset, one row per item.",
)

user_recent_behavior_source = FileSource(
    name="user_recent_behavior_source",
    path="data/user_recent_behavior.parquet",
    timestamp_field="event_timestamp",
    description="One row per (user, distinct event time): the last K events up to and "
                "including that time, oldest first.",
)
