"""The data contract: what every dataset fed to GEM looks like.

This module is the single definition; docs/data-contract.md explains it for people.

A dataset is a directory::

    DIR/
      manifest.json                  name, source, declared time window, vocabularies
      users.parquet                  one row per user (static attributes)
      items.parquet                  one row per item (an ad or an organic item)
      events/day=YYYY-MM-DD/*.parquet  the event log, partitioned by UTC day

An event is one exposure of an item to a user on a surface at ``event_time``.
Ad rows (``is_ad``) always have ``event_type == "impression"``; organic rows record the
user's engagement in ``event_type`` ("view" when not engaged, "like"/"share" when
engaged), so an organic row's event_type is usable only as *history*, never as a
feature of the row itself.

Labels and the time each became known: ``click`` at ``click_time`` (null: at
``event_time``; never before it), ``conversion`` at ``conversion_time`` (later; never
before the click), may be 1 only on an ad row with ``click == 1`` (a conversion follows
a click of the same user on the same ad), and is 0 when the conversion was not
observed inside the window (delayed feedback). A history shows an earlier event's
label only once its time is strictly before the example's time.

Row roles (``role``, null = ``both``): ``both`` rows are examples (ad rows) and history,
``history`` rows only ever appear in later histories (e.g. organic activity that is
never scored), ``example`` rows are scored but never shown in any history (e.g.
impressions that should not feed later histories, or synthetic negatives).

Surfaces: the manifest's ``surfaces`` are the dataset's own vocabulary, the features
stage keeps those that have events, in manifest order. A surface name becomes part of
file names (``students/<surface>.json``) and MLflow names (``student_<surface>``), so it
must be a safe name (``SAFE_NAME``: 1-64 letters, digits, ``_`` or ``-``, starting with a
letter or digit); a manifest declaring another is refused before any work, and an event
row whose surface is not declared is quarantined (``unknown_surface``).
"""

from __future__ import annotations

import datetime as dt
import json
import re
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

import pyarrow as pa

from gem.errors import UserError

SURFACES: tuple[str, ...] = ("feed", "video", "stories", "messaging")
EVENT_TYPES: tuple[str, ...] = ("impression", "view", "like", "share")
AD_EVENT_TYPE = "impression"
TASKS: tuple[str, ...] = ("click", "conversion")
ROLES: tuple[str, ...] = ("both", "history", "example")  # null role = "both"
# optional columns: absent in a file = all null (click known at event_time, role both)
OPTIONAL_EVENT_COLUMNS: tuple[str, ...] = ("click_time", "role")

TIMESTAMP = pa.timestamp("us", tz="UTC")

EVENTS_SCHEMA = pa.schema(
    [
        pa.field("event_id", pa.int64(), nullable=False),
        pa.field("user_id", pa.int64(), nullable=False),
        pa.field("item_id", pa.int64(), nullable=False),
        pa.field("is_ad", pa.bool_(), nullable=False),
        pa.field("surface", pa.string(), nullable=False),
        pa.field("event_time", TIMESTAMP, nullable=False),
        pa.field("event_type", pa.string(), nullable=False),
        pa.field("click", pa.int8(), nullable=False),
        pa.field("conversion", pa.int8(), nullable=False),
        pa.field("conversion_time", TIMESTAMP, nullable=True),
        pa.field("click_time", TIMESTAMP, nullable=True),
        pa.field("role", pa.string(), nullable=True),
    ]
)

USERS_SCHEMA = pa.schema(
    [
        pa.field("user_id", pa.int64(), nullable=False),
        pa.field("age_bucket", pa.string()),
        pa.field("gender", pa.string()),
        pa.field("country", pa.string()),
        pa.field("device", pa.string()),
    ]
)

ITEMS_SCHEMA = pa.schema(
    [
        pa.field("item_id", pa.int64(), nullable=False),
        pa.field("is_ad", pa.bool_(), nullable=False),
        pa.field("advertiser_id", pa.int64()),  # 0 for organic items
        pa.field("category_id", pa.int64()),
        pa.field("format", pa.string()),
        pa.field("objective", pa.string()),  # "organic" for organic items
    ]
)

TABLE_SCHEMAS: dict[str, pa.Schema] = {
    "events": EVENTS_SCHEMA,
    "users": USERS_SCHEMA,
    "items": ITEMS_SCHEMA,
}
PRIMARY_KEYS = {"events": "event_id", "users": "user_id", "items": "item_id"}

# Categorical user/item attributes the features stage turns into sparse ids.
USER_ATTRIBUTES: tuple[str, ...] = ("age_bucket", "gender", "country", "device")
ITEM_ATTRIBUTES: tuple[str, ...] = ("advertiser_id", "category_id", "format", "objective")

MANIFEST = "manifest.json"
EVENTS_DIR = "events"
USERS_FILE = "users.parquet"
ITEMS_FILE = "items.parquet"
DAY_PARTITION = "day"


class ContractError(UserError, ValueError):
    """A file that cannot be read under the contract (not Parquet, missing or mistyped
    column). The message names the file and the column."""


# the one rule for names that become paths or MLflow names (surfaces, tasks)
SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")
SAFE_NAME_RULE = "1-64 letters, digits, '_' or '-', starting with a letter or digit"


def unsafe_names(names) -> list:
    """The names that break SAFE_NAME (they would make paths or MLflow names)."""
    return [n for n in names if not (isinstance(n, str) and SAFE_NAME.fullmatch(n))]


def check_run_inputs(data: str | Path | None, surfaces: list[str]) -> None:
    """Before any work of a run: the surfaces asked for are safe names, and the dataset's
    manifest (when a dataset is given) holds under the contract, as do its day folders
    (``check_day_partitions``). ContractError if not."""
    bad = unsafe_names(surfaces)
    if bad:
        raise ContractError(f"surfaces {bad}: not safe names ({SAFE_NAME_RULE})")
    if data:
        check_day_partitions(Path(data), Manifest.read(Path(data)))


DAY_RULE = f"{EVENTS_DIR}/{DAY_PARTITION}=YYYY-MM-DD, a real calendar day"


def partition_day(folder: Path) -> dt.date:
    """The UTC day an ``events/day=YYYY-MM-DD`` folder holds; ContractError naming the
    folder and the rule when its name is not one (``day=2026-02-30``, ``day=today``)."""
    name = Path(folder).name
    prefix = f"{DAY_PARTITION}="
    try:
        if not name.startswith(prefix):
            raise ValueError("no day= prefix")
        return dt.date.fromisoformat(name[len(prefix):])
    except ValueError as exc:
        raise ContractError(f"{folder}: not a day partition ({exc}): event folders are named {DAY_RULE}; "
                            "rename or remove it") from None


def event_days(root: Path) -> dict[dt.date, Path]:
    """The day partitions of ``root`` that hold event files (hidden and ``_`` files do not
    count), by day; a folder whose name is not a day is refused (``partition_day``)."""
    days = {}
    for folder in sorted((Path(root) / EVENTS_DIR).glob(f"{DAY_PARTITION}=*")):
        if folder.is_dir() and any(p.is_file() and not p.name.startswith((".", "_")) for p in folder.iterdir()):
            days[partition_day(folder)] = folder
    return days


def check_day_partitions(root: Path, manifest: "Manifest | None" = None) -> dict[dt.date, Path]:
    """Every day folder of ``root`` holding events names a real day inside the manifest's
    window (their rows would all be quarantined: 18% of a run's rows for one new day past
    ``window_end``). ContractError naming the folder, the bound and the way on; returns
    ``event_days``."""
    manifest = manifest or Manifest.read(Path(root))
    days = event_days(root)
    first, last = manifest.start.date(), (manifest.end - dt.timedelta(microseconds=1)).date()
    for day, folder in days.items():
        if day > last:
            end = dt.datetime.combine(day + dt.timedelta(days=1), dt.time(), tzinfo=dt.timezone.utc).isoformat()
            raise ContractError(f"{folder}: a day past the manifest's window_end {manifest.window_end} "
                                f"({Path(root) / MANIFEST}); extend window_end to {end} or later to take it in, "
                                "or move the folder out")
        if day < first:
            raise ContractError(f"{folder}: a day before the manifest's window_start {manifest.window_start} "
                                f"({Path(root) / MANIFEST}); move window_start back to {day.isoformat()} or "
                                "earlier to take it in, or move the folder out")
    return days


@dataclass(kw_only=True)
class Manifest:
    """Describes a dataset: where it came from and the window its events must lie in.

    ``window_start`` is inclusive and ``window_end`` exclusive, both UTC ISO-8601.
    """

    name: str
    source: str
    window_start: str
    window_end: str
    surfaces: list[str] = field(default_factory=lambda: list(SURFACES))
    event_types: list[str] = field(default_factory=lambda: list(EVENT_TYPES))
    description: str = ""
    extra: dict = field(default_factory=dict)

    @property
    def start(self) -> dt.datetime:
        return parse_utc(self.window_start)

    @property
    def end(self) -> dt.datetime:
        return parse_utc(self.window_end)

    def days(self) -> list[dt.date]:
        """The UTC days the window covers."""
        first, last = self.start.date(), (self.end - dt.timedelta(microseconds=1)).date()
        return [first + dt.timedelta(days=i) for i in range((last - first).days + 1)]

    def write(self, directory: Path) -> Path:
        path = Path(directory) / MANIFEST
        path.write_text(json.dumps(asdict(self), indent=2, sort_keys=True) + "\n")
        return path

    @classmethod
    def read(cls, directory: Path) -> "Manifest":
        return cls.parse(read_manifest_json(directory), Path(directory) / MANIFEST)

    @classmethod
    def parse(cls, raw: dict, path: Path) -> "Manifest":
        """The manifest of ``raw`` (the JSON of ``path``), checked under the contract."""
        if not isinstance(raw, dict):
            raise ContractError(f"{path}: not a JSON object")
        missing = [k for k in ("name", "source", "window_start", "window_end") if k not in raw]
        if missing:
            raise ContractError(f"{path}: missing field(s) {missing}")
        surfaces = raw.get("surfaces", list(SURFACES))
        if (not isinstance(surfaces, list) or not surfaces or len(set(surfaces)) != len(surfaces)
                or not all(isinstance(s, str) and s for s in surfaces)):
            raise ContractError(f"{path}: surfaces must be a non-empty list of distinct names, got {surfaces!r}")
        bad = unsafe_names(surfaces)
        if bad:
            raise ContractError(f"{path}: surface name(s) {bad} are not safe names ({SAFE_NAME_RULE}): they "
                                "become file and MLflow model names; rename them in the manifest and the events")
        unknown = sorted(set(raw) - {f.name for f in fields(cls)})
        if unknown:
            raise ContractError(f"{path}: unknown field(s) {unknown}")
        return cls(**raw)


def read_manifest_json(directory: Path) -> dict:
    path = Path(directory) / MANIFEST
    if not path.is_file():
        raise ContractError(f"{path}: missing; a dataset directory needs a {MANIFEST}")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ContractError(f"{path}: not valid JSON ({exc})") from exc


class DatasetHandle:
    """A contract dataset as one stage sees it: its folder (resolved), its manifest read
    and checked once, and its content digests from one walk of its files, taken on first
    use. A stage opens it once (``DatasetHandle.open``) and passes it down, so its helpers
    neither re-read the manifest nor hash the tree again; ``open`` of a handle is the
    handle. The digests are of the files as they were at that walk."""

    def __init__(self, root: Path, raw_manifest: dict):
        self.root = Path(root)
        self.raw_manifest = raw_manifest  # the JSON as written (the validation stamp digests it)
        self.manifest = Manifest.parse(raw_manifest, self.root / MANIFEST)
        self._files: list[tuple[str, str]] | None = None

    @classmethod
    def open(cls, data: "str | Path | DatasetHandle") -> "DatasetHandle":
        if isinstance(data, DatasetHandle):
            return data
        root = Path(data).resolve()
        return cls(root, read_manifest_json(root))

    def __fspath__(self) -> str:
        return str(self.root)

    def __repr__(self) -> str:
        return f"DatasetHandle({str(self.root)!r})"

    @property
    def files(self) -> list[tuple[str, str]]:
        """(relative path, sha256) of every non-hidden file: the one walk of the tree."""
        if self._files is None:
            from gem.utils.digest import tree_files

            self._files = tree_files(self.root)
        return self._files

    @property
    def digest(self) -> str:
        """``gem.utils.digest.tree_digest`` of the folder."""
        return self.digest_excluding(())

    def digest_excluding(self, names: tuple[str, ...]) -> str:
        """``tree_digest(root, exclude=names)``, from the same walk."""
        from gem.utils.digest import digest_of_files

        return digest_of_files(self.files, exclude=names)

    def day_digests(self) -> dict[str, str]:
        """Each event day partition's content digest (its files' paths and bytes), from the
        same walk: day (YYYY-MM-DD) -> sha256."""
        from gem.utils.digest import digest_of_files

        by_day: dict[str, list[tuple[str, str]]] = {}
        prefix = f"{EVENTS_DIR}/{DAY_PARTITION}="
        for rel, digest in self.files:
            if rel.startswith(prefix) and rel.count("/") == 2:
                by_day.setdefault(rel[len(prefix):].split("/", 1)[0], []).append((rel, digest))
        return {day: digest_of_files(files) for day, files in sorted(by_day.items())}


def parse_utc(text: str) -> dt.datetime:
    """Parse an ISO-8601 time; naive times are taken as UTC."""
    value = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    return value if value.tzinfo else value.replace(tzinfo=dt.timezone.utc)


def day_dir(root: Path, day: dt.date) -> Path:
    return Path(root) / EVENTS_DIR / f"{DAY_PARTITION}={day.isoformat()}"


def event_files(root: Path) -> list[Path]:
    """Every event file of a dataset, in day then name order (the canonical row order)."""
    base = Path(root) / EVENTS_DIR
    if not base.is_dir():
        raise ContractError(f"{base}: missing; events live under {EVENTS_DIR}/day=YYYY-MM-DD/")
    files = [p for p in base.glob(f"{DAY_PARTITION}=*/*") if p.is_file() and not p.name.startswith((".", "_"))]
    return sorted(files)


def empty_events() -> pa.Table:
    return EVENTS_SCHEMA.empty_table()


def with_optional_columns(table: pa.Table) -> pa.Table:
    """``table`` with every optional event column the file lacks added as nulls."""
    for name in OPTIONAL_EVENT_COLUMNS:
        if name not in table.column_names:
            fld = EVENTS_SCHEMA.field(name)
            table = table.append_column(fld, pa.nulls(table.num_rows, fld.type))
    return table
