from typing import NamedTuple

from components.base import component


@component
def resolve_champion(ctx: str) -> NamedTuple("Champion", init_from=str, vocab_from=str):
    """The champion teacher to continue from, and the features whose vocabularies its
    embedding tables use."""
    from collections import namedtuple

    from gem import tracking
    from gem.stages import RunContext, champion_teacher

    run = RunContext.loads(ctx)
    tracking.configure(run.tracking_root, experiment=run.experiment)
    champion = champion_teacher()
    return namedtuple("Champion", ["init_from", "vocab_from"])(champion["uri"], champion["features_dir"])
