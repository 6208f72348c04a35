import pytest

from gem.data.batch import FeatureSpec


@pytest.fixture
def spec() -> FeatureSpec:
    return FeatureSpec(
        sparse={"user_id": 200, "country": 8, "item_id": 300, "advertiser_id": 20},
        sequence={"hist_item_id": 300, "hist_event_type": 4},
        dense=["user_age_days", "item_ctr"],
        max_seq_len=16,
    )
