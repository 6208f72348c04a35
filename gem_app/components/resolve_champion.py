from typing import NamedTuple

from gem_app.components.base import component


@component
def resolve_champion(ctx: str) -> NamedTuple("Champion", init_from=str, vocab_from=str):
    """The champion teacher to continue from, and the features whose vocabularies its
    embedding tables use."""
    from collections import namedtuple

    from gem_app.stages.context import RunContext
    from gem_app.stages.gate import champion_teacher

    context = RunContext.loads(ctx)
    context.configure()
    champion = champion_teacher(context.tracking_root)
    return namedtuple("Champion", ["init_from", "vocab_from"])(champion["uri"], champion["features_dir"])
