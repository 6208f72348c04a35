"""Entities: the keys features hang on (raw contract ids, not dense ids)."""

from feast import Entity, ValueType

user = Entity(name="user", join_keys=["user_id"], value_type=ValueType.INT64,
              description="A person who sees ads and organic items (contract users.user_id).")

item = Entity(name="item", join_keys=["item_id"], value_type=ValueType.INT64,
              description="An ad or an organic item (contract items.item_id).")

advertiser = Entity(name="advertiser", join_keys=["advertiser_id"], value_type=ValueType.INT64,
                    description="An advertiser (contract items.advertiser_id).")

category = Entity(name="category", join_keys=["category_id"], value_type=ValueType.INT64,
                  description="An item category (contract items.category_id).")

surface = Entity(name="surface", join_keys=["surface"], value_type=ValueType.STRING,
                 description="A surface (domain) of the dataset, by name (contract events.surface).")
