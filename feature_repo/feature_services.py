"""Feature services: one per model and version, so each model's inputs are pinned."""

from feast import FeatureService

from features import item_attributes, user_attributes, user_recent_behavior

gem_pretraining_v1 = FeatureService(
    name="gem_pretraining_v1",
    features=[user_attributes, item_attributes, user_recent_behavior],
    tags={"model": "gem", "stage": "pretraining"},
)


def _vertical(surface: str) -> FeatureService:
    return FeatureService(
        name=f"{surface}_vertical_v1",
        features=[user_attributes, item_attributes, user_recent_behavior],
        tags={"model": f"{surface}_vertical", "surface": surface},
    )


feed_vertical_v1 = _vertical("feed")
video_vertical_v1 = _vertical("video")
stories_vertical_v1 = _vertical("stories")
messaging_vertical_v1 = _vertical("messaging")
