"""Ads-event simulator: a contract dataset of any size, learnable and drifting.

The world:
- K latent topics. Each item has one topic (its category is a sub-topic) and a
  quality; ads also have an advertiser, format and objective.
- Each user has topic-interest logits (shifted by age bucket and country, so static
  attributes carry signal), a per-surface offset (the same user prefers other topics
  on video than on feed), a surface mix (shaped by device) and a long-tailed activity
  rate (most users have tens of events, a few thousands).
- Interests drift every day (a random walk), and topic trends drift globally, so a
  model trained on old days goes stale.
- Each event: the platform picks a topic (partly by the user's current interest,
  partly at random) and a popular item of that topic; ads are interleaved at a
  surface-specific rate. Click probability rises with interest match, item quality,
  the topic's trend and surface/format fit. A clicked ad converts with a small
  probability driven by match, objective and advertiser; the conversion lands after
  an exponential delay and is dropped if it falls after the window (delayed feedback).

Generation runs in fixed-size user chunks, each with its own RNG stream derived from
the seed, so output is deterministic for a seed and memory is bounded by one chunk.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa

from gem.config import check_ranges, ranged
from gem.data.contract import (
    EVENTS_SCHEMA,
    ITEMS_FILE,
    ITEMS_SCHEMA,
    SURFACES,
    USERS_FILE,
    USERS_SCHEMA,
    Manifest,
    day_dir,
)
from gem.data.io import claim_dataset_output, write_parquet_atomic
from gem.utils.pool import process_pool

log = logging.getLogger(__name__)

AGE_BUCKETS = ("13-17", "18-24", "25-34", "35-44", "45-54", "55+")
GENDERS = ("f", "m", "u")
COUNTRIES = ("US", "BR", "IN", "ID", "MX", "GB", "DE", "FR", "JP", "NG")
DEVICES = ("ios", "android", "web")
FORMATS = ("image", "video", "carousel", "text")
OBJECTIVES = ("awareness", "traffic", "conversions", "app_installs")
SECONDS_PER_DAY = 86_400


@dataclass(kw_only=True)
class SimulatorConfig:
    users: int = ranged(2_000, ge=1)
    items: int = ranged(5_000, ge=1)
    days: int = ranged(7, ge=1)
    seed: int = 0
    start_date: str = "2026-01-01"
    topics: int = ranged(24, ge=1)
    categories_per_topic: int = ranged(4, ge=1)
    advertisers: int = ranged(300, ge=1)
    ad_fraction_of_items: float = ranged(0.4, ge=0, le=1)
    # events per user per day ~ lognormal(mean log rate, sigma), clipped
    activity_log_mean: float = 1.1
    activity_log_sigma: float = ranged(1.2, ge=0)
    activity_max_per_day: float = ranged(400.0, gt=0)
    ad_rate_by_surface: tuple[float, ...] = ranged((0.25, 0.15, 0.2, 0.1), ge=0, le=1)
    interest_scale: float = 1.6
    exposure_by_interest: float = ranged(0.6, ge=0, le=1)  # share of exposures targeted by the platform
    interest_drift: float = ranged(0.25, ge=0)  # per-day random-walk step of interest logits
    trend_drift: float = ranged(0.3, ge=0)  # per-day random-walk step of topic trends
    surface_interest_scale: float = 0.9
    click_bias: float = -5.6
    click_match_weight: float = 1.4
    organic_click_bias: float = 1.2  # organic engagement is more common than ad clicks
    conversion_bias: float = -4.2
    conversion_match_weight: float = 0.8
    conversion_delay_hours: float = ranged(8.0, ge=0)
    # 0: a click is known at its event_time (click_time null); > 0: it becomes known an
    # exponential delay later (click_time), like a label attributed after the exposure
    click_delay_hours: float = ranged(0.0, ge=0)
    users_per_chunk: int = ranged(10_000, ge=1)
    workers: int = ranged(0, ge=0)  # processes; 0 = one per core


@dataclass
class _World:
    """Everything shared by all chunks (items, global trends, static effects)."""

    item_topic: np.ndarray
    item_is_ad: np.ndarray
    item_quality: np.ndarray
    item_format: np.ndarray
    item_objective: np.ndarray
    item_advertiser: np.ndarray
    pool_cum: np.ndarray  # cumulative popularity, groups (topic, is_ad) at [g, g+1)
    pool_items: np.ndarray  # item index sorted by group
    trend: np.ndarray  # (days, topics)
    age_topic: np.ndarray  # (ages, topics)
    country_topic: np.ndarray  # (countries, topics)
    surface_bias: np.ndarray  # (surfaces,)
    format_surface: np.ndarray  # (formats, surfaces)
    objective_conv: np.ndarray  # (objectives,)
    advertiser_conv: np.ndarray  # (advertisers,)
    device_surface: np.ndarray  # (devices, surfaces) log-weights


def simulate(cfg: SimulatorConfig, out: str | Path, *, progress: bool = True) -> Manifest:
    """Write a contract dataset to ``out`` and return its manifest."""
    _check(cfg)
    out = Path(out)
    claim_dataset_output(out)
    root_seq = np.random.SeedSequence(cfg.seed)
    world_seq, users_seq, *chunk_seqs = root_seq.spawn(2 + _num_chunks(cfg))
    world = _make_world(cfg, np.random.default_rng(world_seq))
    _write_items(cfg, world, out)
    start = dt.datetime.fromisoformat(cfg.start_date).replace(tzinfo=dt.timezone.utc)
    users_rng = np.random.default_rng(users_seq)
    user_attrs = _make_users(cfg, users_rng)
    write_parquet_atomic(pa.table(_user_columns(user_attrs), schema=USERS_SCHEMA), out / USERS_FILE)

    started = time.perf_counter()
    total = 0
    jobs = [
        (cfg, world, user_attrs, i * cfg.users_per_chunk, min(cfg.users, (i + 1) * cfg.users_per_chunk),
         seq, start, out, i)
        for i, seq in enumerate(chunk_seqs)
    ]
    workers = max(1, min(cfg.workers or os.cpu_count() or 1, len(jobs)))
    with process_pool(workers) as pool:
        for (_, _, _, _, hi, *_), produced in zip(jobs, pool.map(_run_chunk, jobs)):
            total += produced
            if progress:
                rate = total / max(time.perf_counter() - started, 1e-9)
                log.info("simulate: users %d/%d, %d events (%.2fM events/s)", hi, cfg.users, total, rate / 1e6)
    manifest = Manifest(
        name=out.name,
        source="simulator",
        window_start=start.isoformat(),
        window_end=(start + dt.timedelta(days=cfg.days)).isoformat(),
        description=f"GEM ads-event simulator, seed {cfg.seed}",
        extra={"config": {k: v for k, v in vars(cfg).items()}, "events": total},
    )
    manifest.write(out)
    return manifest


def _run_chunk(job: tuple) -> int:
    cfg, world, users, lo, hi, seq, start, out, chunk = job
    return _simulate_chunk(cfg, world, users, lo, hi, np.random.default_rng(seq), start, out, chunk)


def _check(cfg: SimulatorConfig) -> None:
    from gem.config import ConfigError

    check_ranges(cfg)
    try:
        dt.datetime.fromisoformat(cfg.start_date)
    except ValueError:
        raise ConfigError(f"start_date={cfg.start_date!r} is not an ISO-8601 day (e.g. 2026-01-01)") from None
    if len(cfg.ad_rate_by_surface) != len(SURFACES):
        raise ConfigError(
            f"ad_rate_by_surface has {len(cfg.ad_rate_by_surface)} entries; one per surface {SURFACES}"
        )
    if cfg.items < 2 * cfg.topics:
        raise ConfigError(f"items ({cfg.items}) must be at least 2 x topics ({cfg.topics})")


def _num_chunks(cfg: SimulatorConfig) -> int:
    return -(-cfg.users // cfg.users_per_chunk)


def _make_world(cfg: SimulatorConfig, rng: np.random.Generator) -> _World:
    n_items, k = cfg.items, cfg.topics
    item_topic = rng.integers(0, k, n_items)
    item_is_ad = rng.random(n_items) < cfg.ad_fraction_of_items
    # make every (topic, is_ad) pool non-empty
    item_topic[: 2 * k] = np.repeat(np.arange(k), 2)
    item_is_ad[: 2 * k] = np.tile([True, False], k)
    popularity = rng.pareto(1.2, n_items) + 1.0
    group = item_topic * 2 + item_is_ad.astype(np.int64)
    order = np.lexsort((rng.random(n_items), group))
    pool_items = order
    pool_group = group[order]
    weights = popularity[order]
    cum = np.zeros(n_items)
    for g in np.unique(pool_group):
        sel = np.flatnonzero(pool_group == g)
        w = np.cumsum(weights[sel])
        cum[sel] = g + w / w[-1]
    return _World(
        item_topic=item_topic,
        item_is_ad=item_is_ad,
        item_quality=rng.normal(0.0, 0.5, n_items),
        item_format=rng.integers(0, len(FORMATS), n_items),
        item_objective=rng.integers(0, len(OBJECTIVES), n_items),
        item_advertiser=rng.integers(1, cfg.advertisers + 1, n_items),
        pool_cum=cum,
        pool_items=pool_items,
        trend=np.cumsum(rng.normal(0.0, cfg.trend_drift, (cfg.days, k)), axis=0),
        age_topic=rng.normal(0.0, 0.8, (len(AGE_BUCKETS), k)),
        country_topic=rng.normal(0.0, 0.5, (len(COUNTRIES), k)),
        surface_bias=np.array([0.0, 0.3, -0.2, -0.5]),
        format_surface=rng.normal(0.0, 0.4, (len(FORMATS), len(SURFACES))),
        objective_conv=np.array([-1.0, -0.3, 0.6, 0.2]),
        advertiser_conv=rng.normal(0.0, 0.5, cfg.advertisers + 1),
        device_surface=np.log(np.array([[4, 3, 2, 1], [4, 2, 2, 2], [5, 2, 0.3, 1.0]])),
    )


def _make_users(cfg: SimulatorConfig, rng: np.random.Generator) -> dict[str, np.ndarray]:
    n = cfg.users
    return {
        "age": rng.choice(len(AGE_BUCKETS), n, p=[0.08, 0.25, 0.27, 0.18, 0.12, 0.10]),
        "gender": rng.choice(len(GENDERS), n, p=[0.48, 0.48, 0.04]),
        "country": rng.choice(len(COUNTRIES), n, p=_zipf(len(COUNTRIES), 0.8)),
        "device": rng.choice(len(DEVICES), n, p=[0.4, 0.5, 0.1]),
    }


def _zipf(n: int, s: float) -> np.ndarray:
    w = 1.0 / np.arange(1, n + 1) ** s
    return w / w.sum()


def _user_columns(u: dict[str, np.ndarray]) -> dict[str, pa.Array]:
    n = len(u["age"])
    return {
        "user_id": pa.array(np.arange(1, n + 1, dtype=np.int64)),
        "age_bucket": pa.array(np.asarray(AGE_BUCKETS, dtype=object)[u["age"]]),
        "gender": pa.array(np.asarray(GENDERS, dtype=object)[u["gender"]]),
        "country": pa.array(np.asarray(COUNTRIES, dtype=object)[u["country"]]),
        "device": pa.array(np.asarray(DEVICES, dtype=object)[u["device"]]),
    }


def _write_items(cfg: SimulatorConfig, w: _World, out: Path) -> None:
    n = cfg.items
    is_ad = w.item_is_ad
    category = w.item_topic * cfg.categories_per_topic + (np.arange(n) % cfg.categories_per_topic) + 1
    table = pa.table(
        {
            "item_id": pa.array(np.arange(1, n + 1, dtype=np.int64)),
            "is_ad": pa.array(is_ad),
            "advertiser_id": pa.array(np.where(is_ad, w.item_advertiser, 0).astype(np.int64)),
            "category_id": pa.array(category.astype(np.int64)),
            "format": pa.array(np.asarray(FORMATS, dtype=object)[w.item_format]),
            "objective": pa.array(
                np.where(is_ad, np.asarray(OBJECTIVES, dtype=object)[w.item_objective], "organic")
            ),
        },
        schema=ITEMS_SCHEMA,
    )
    write_parquet_atomic(table, out / ITEMS_FILE)


def _simulate_chunk(cfg: SimulatorConfig, w: _World, users: dict[str, np.ndarray], lo: int, hi: int,
                    rng: np.random.Generator, start: dt.datetime, out: Path, chunk: int) -> int:
    n_users, k, n_days, n_surf = hi - lo, cfg.topics, cfg.days, len(SURFACES)
    age, country, device = users["age"][lo:hi], users["country"][lo:hi], users["device"][lo:hi]

    # per-user latent state
    base = rng.normal(0.0, cfg.interest_scale, (n_users, k)) + w.age_topic[age] + w.country_topic[country]
    walk = np.cumsum(rng.normal(0.0, cfg.interest_drift, (n_days, n_users, k)), axis=0)
    interest = (base[None] + walk).astype(np.float32)  # (days, users, topics)
    surface_shift = rng.normal(0.0, cfg.surface_interest_scale, (n_users, n_surf, k)).astype(np.float32)
    surface_logits = w.device_surface[device] + rng.normal(0.0, 0.7, (n_users, n_surf))
    surface_cum = np.cumsum(_softmax(surface_logits), axis=1)
    rate = np.exp(rng.normal(cfg.activity_log_mean, cfg.activity_log_sigma, n_users))
    rate = np.minimum(rate, cfg.activity_max_per_day)
    user_bias = rng.normal(0.0, 0.5, n_users)

    counts = rng.poisson(rate[:, None] * rng.uniform(0.7, 1.3, (n_users, n_days)))
    n = int(counts.sum())
    if n == 0:
        return 0
    u_local = np.repeat(np.repeat(np.arange(n_users), n_days), counts.ravel())
    day = np.repeat(np.tile(np.arange(n_days), n_users), counts.ravel())
    second = rng.random(n) * SECONDS_PER_DAY  # float64: microsecond timestamps
    surface = (rng.random(n, dtype=np.float32)[:, None] > surface_cum[u_local]).sum(axis=1).clip(0, n_surf - 1)
    is_ad = rng.random(n, dtype=np.float32) < np.asarray(cfg.ad_rate_by_surface)[surface]

    # exposure: targeted by the user's interest of the day, or random. Topic sampling
    # goes through one CDF per (user, day) group, offset so that group g occupies
    # [g, g+1): one searchsorted samples every event (events are user-major, so the
    # keys arrive nearly sorted and the search stays cache-friendly).
    daily = interest.transpose(1, 0, 2).reshape(-1, k)  # (users * days, topics)
    cdf = np.cumsum(_softmax(daily), axis=1)
    cdf /= cdf[:, -1:]
    cdf += np.arange(len(cdf))[:, None]
    group_ud = u_local * n_days + day
    targeted = np.clip(np.searchsorted(cdf.ravel(), group_ud + rng.random(n) * 0.999999) - group_ud * k, 0, k - 1)
    topic = np.where(rng.random(n, dtype=np.float32) < cfg.exposure_by_interest, targeted, rng.integers(0, k, n))
    pool_group = topic * 2 + is_ad
    pos = np.searchsorted(w.pool_cum, pool_group + rng.random(n))
    item = w.pool_items[np.minimum(pos, len(w.pool_items) - 1)]

    # interest match on this surface, centred per user-day and user-surface, in units
    # of the logits' standard deviation
    daily_centred = daily - daily.mean(axis=1, keepdims=True)
    shift_centred = surface_shift - surface_shift.mean(axis=2, keepdims=True)
    scale = np.sqrt(cfg.interest_scale**2 + cfg.surface_interest_scale**2)
    match = (daily_centred.ravel()[group_ud * k + topic]
             + shift_centred.reshape(-1)[(u_local * n_surf + surface) * k + topic]) / scale
    click_logit = (
        cfg.click_bias
        + cfg.click_match_weight * match
        + w.item_quality[item]
        + w.trend[day, topic] * 0.5
        + w.surface_bias[surface]
        + np.where(is_ad, w.format_surface[w.item_format[item], surface], cfg.organic_click_bias)
        + user_bias[u_local]
    )
    click = rng.random(n, dtype=np.float32) < _sigmoid(click_logit)
    conv_logit = (
        cfg.conversion_bias
        + cfg.conversion_match_weight * match
        + w.objective_conv[w.item_objective[item]]
        + w.advertiser_conv[w.item_advertiser[item]]
    )
    converts = click & is_ad & (rng.random(n, dtype=np.float32) < _sigmoid(conv_logit))
    delay = rng.exponential(cfg.conversion_delay_hours * 3600.0, n)
    event_s = day * SECONDS_PER_DAY + second
    conv_s = event_s + 1.0 + delay
    click_s = event_s
    if cfg.click_delay_hours > 0:  # drawn last: the other draws do not depend on it
        click_s = event_s + rng.exponential(cfg.click_delay_hours * 3600.0, n)
        click &= click_s < n_days * SECONDS_PER_DAY  # a click known after the window is not observed
        conv_s = np.maximum(conv_s, click_s + 1.0)
        converts &= click
    converts &= conv_s < n_days * SECONDS_PER_DAY  # not observed inside the window

    event_type = np.where(is_ad, 0, np.where(click, np.where(rng.random(n, dtype=np.float32) < 0.7, 2, 3), 1))

    order = np.lexsort((event_s, u_local))
    start_us = int(start.timestamp() * 1_000_000)
    event_us = start_us + (event_s * 1_000_000).astype(np.int64)
    conv_us = start_us + (conv_s * 1_000_000).astype(np.int64)
    click_us = start_us + (np.asarray(click_s) * 1_000_000).astype(np.int64)
    click_known_later = click & (click_us > event_us)
    user_id = (lo + u_local + 1).astype(np.int64)
    event_id = (np.int64(chunk) << 40) + np.arange(n, dtype=np.int64)
    types = pa.array(["impression", "view", "like", "share"])
    surfaces = pa.array(list(SURFACES))
    for d in range(n_days):
        sel = order[day[order] == d]
        if sel.size == 0:
            continue
        conv_mask = ~converts[sel]
        table = pa.table(
            [
                pa.array(event_id[sel]),
                pa.array(user_id[sel]),
                pa.array(item[sel].astype(np.int64) + 1),
                pa.array(is_ad[sel]),
                surfaces.take(pa.array(surface[sel])),
                pa.array(event_us[sel], type=pa.int64()).cast(EVENTS_SCHEMA.field("event_time").type),
                types.take(pa.array(event_type[sel])),
                pa.array(click[sel].astype(np.int8)),
                pa.array(converts[sel].astype(np.int8)),
                pa.array(np.ma.masked_array(conv_us[sel], mask=conv_mask), type=pa.int64()).cast(
                    EVENTS_SCHEMA.field("conversion_time").type
                ),
                pa.array(np.ma.masked_array(click_us[sel], mask=~click_known_later[sel]), type=pa.int64()).cast(
                    EVENTS_SCHEMA.field("click_time").type
                ),
                pa.nulls(len(sel), pa.string()),
            ],
            schema=EVENTS_SCHEMA,
        )
        day_path = day_dir(out, (start + dt.timedelta(days=d)).date())
        write_parquet_atomic(table, day_path / f"part-{chunk:05d}.parquet")
    return n


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))
