"""Feature views: static user/item attributes and the recent-behaviour arrays."""

from datetime import timedelta

from feast import FeatureView, Field
from feast.types import Array, Bool, Int64, String

from data_sources import item_attributes_source, user_attributes_source, user_recent_behavior_source
from entities import item, user

user_attributes = FeatureView(
    name="user_attributes",
    entities=[user],
    ttl=timedelta(0),  # static: never expires
    schema=[
        Field(name="age_bucket", dtype=String),
        Field(name="gender", dtype=String),
        Field(name="country", dtype=String),
        Field(name="device", dtype=String),
    ],
    source=user_attributes_source,
    online=True,
    tags={"kind": "static"},
)

item_attributes = FeatureView(
    name="item_attributes",
    entities=[item],
    ttl=timedelta(0),
    schema=[
        Field(name="is_ad", dtype=Bool),
        Field(name="advertiser_id", dtype=Int64),
        Field(name="category_id", dtype=Int64),
        Field(name="format", dtype=String),
        Field(name="objective", dtype=String),
    ],
    source=item_attributes_source,
    online=True,
    tags={"kind": "static"},
)

user_recent_behavior = FeatureView(
    name="user_recent_behavior",
    entities=[user],
    ttl=timedelta(0),
    schema=[
        Field(name="recent_item_ids", dtype=Array(Int64)),
        Field(name="recent_event_types", dtype=Array(String)),
        Field(name="recent_surfaces", dtype=Array(String)),
        Field(name="history_count", dtype=Int64),
    ],
    source=user_recent_behavior_source,
    online=True,
    tags={"kind": "sequence", "note": "online serving; training reads full sequences from gem.features shards"},
)
