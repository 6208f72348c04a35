"""Point-in-time counters served online: each entity's impressions, clicks and
conversions over 1d / 7d / 30d / all time, and the log's, as of the export's instant.

Written by ``gem.features.feast_sources.write_counters`` with the same counting code the
features build uses (gem/features/counters.py): a scorer reads here, as of the last
materialization, the counts a training example reads from its shard. Training never
reads these views (an offline lookup before the export instant would see later rows).
"""

from datetime import timedelta

from feast import FeatureView, Field, FileSource
from feast.types import Int64

from entities import advertiser, category, item, surface, user

HORIZONS = ("1d", "7d", "30d", "all")  # gem.features.counters.HORIZONS
SIGNALS = ("impressions", "clicks", "conversions")  # gem.features.counters.SIGNALS


def _view(kind: str, entities: list, doc: str) -> FeatureView:
    source = FileSource(name=f"{kind}_counters_source", path=f"data/{kind}_counters.parquet",
                        timestamp_field="event_timestamp", description=f"{doc}: counts as of the export.")
    fields = [Field(name=f"n_{kind}_{h}_{s}", dtype=Int64) for h in HORIZONS for s in SIGNALS]
    # the log's own counts: the prior of the smoothed rates and the traffic the shares divide by
    fields += [Field(name=f"n_global_{h}_{s}", dtype=Int64) for h in HORIZONS for s in SIGNALS]
    return FeatureView(name=f"{kind}_counters", entities=entities, ttl=timedelta(0), schema=fields, source=source,
                       online=True, tags={"kind": "counters", "note": "online serving; training reads the shards"})


item_counters = _view("item", [item], "Per item")
advertiser_counters = _view("advertiser", [advertiser], "Per advertiser")
category_counters = _view("category", [category], "Per item category")
surface_item_counters = _view("surface_item", [surface, item], "Per (surface, item)")
user_counters = _view("user", [user], "Per user")
