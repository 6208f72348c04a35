"""Picklable job functions for the build's worker processes.

Kept apart from build.py so a worker imports only staging/shards (no torch, no Feast
until a stage job asks Feast for attributes).
"""

from __future__ import annotations

from pathlib import Path

from gem.features.counters import count_job_files
from gem.features.index import index_bucket
from gem.features.plan import BuildPlan, ShardKey
from gem.features.shards import build_shard
from gem.features.staging import stage_group
from gem.features.vocab import Vocabularies


def stage_job(job: tuple[BuildPlan, int]) -> int:
    plan, group = job
    return stage_group(plan, Vocabularies.read(Path(plan.out_dir)), group)


def shard_job(job: tuple[BuildPlan, ShardKey]) -> dict:
    return build_shard(*job)


def index_job(job: tuple[BuildPlan, int]) -> int:
    return index_bucket(*job)


def counter_job(job: tuple[BuildPlan, int]) -> int:
    plan, group = job
    return count_job_files(plan, tuple(plan.counter_groups[group]), group)
