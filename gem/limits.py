"""The longest history training takes without being asked to (issue 42, case 4).

The jagged attention kernels (kernels/) were tested and benchmarked on sequences of at
most 4,096 tokens: the benchmark's long batch (kernels/README.md "Measured (CPU)",
benchmarks/results/kernels.json: 32 sequences, mean 758, max 4,096) took ~2-3 s per
forward+backward of one attention layer on this project's 2-core CPU; the AVX2 kernel
itself takes sequences up to 2,048 tokens (NATIVE_MAX_LEN) and longer ones run torch's
flash kernels. A step's attention grows with the square of the longest history: a
65,536-event history is 256x the work of a 4,096-event one per sequence and head
(minutes per step on a CPU), in one native call that Ctrl-C cannot interrupt.

So a window whose stored histories may be longer than MAX_TESTED_SEQ_LEN is refused by
``gem train`` (and the pipeline's train stage) before any work, unless the run sets
``allow_long_sequences: true``; the features build warns when it writes one.
No torch here: the features build imports this too.
"""

from __future__ import annotations

import json
from pathlib import Path

MAX_TESTED_SEQ_LEN = 4096  # kernels/README.md: the long benchmark batch's longest sequence
OVERRIDE = "allow_long_sequences"
# gem.training.data.SYNTHETIC_PREFIX, spelt here: the features build imports this module and
# the library's layers keep features below training (tests/test_layers.py)
SYNTHETIC = "synthetic://"


def longest_stored(sequence_length: dict) -> int:
    """An upper bound of the longest stored history of a features report's
    ``sequence_length`` (its histogram's last non-empty bin's end; bins 0, 1, 2, 4, ...,
    max_seq_len), or its max_seq_len when the report holds no histogram."""
    bins, hist = sequence_length.get("bins") or [], sequence_length.get("hist") or []
    max_seq_len = int(sequence_length.get("max_seq_len") or 0)
    filled = [i for i, count in enumerate(hist) if count]
    if not bins or not filled or len(bins) < len(hist) + 1:
        return max_seq_len
    return min(int(bins[filled[-1] + 1]) - 1, max_seq_len) if max_seq_len else int(bins[filled[-1] + 1]) - 1


def examples_over(sequence_length: dict, limit: int) -> int:
    """Examples of the report whose histogram bin reaches past ``limit``."""
    bins, hist = sequence_length.get("bins") or [], sequence_length.get("hist") or []
    return sum(int(count) for i, count in enumerate(hist) if i + 1 < len(bins) and int(bins[i + 1]) - 1 > limit)


def build_warning(report: dict) -> str | None:
    """The features build's warning when the window keeps histories longer than the
    kernels' tested range (None when it does not)."""
    lengths = report.get("sequence_length") or {}
    longest, limit = longest_stored(lengths), MAX_TESTED_SEQ_LEN
    if longest <= limit:
        return None
    return (f"{examples_over(lengths, limit):,} example(s) keep histories longer than {limit:,} events (up to "
            f"{longest:,}; max_seq_len {lengths.get('max_seq_len')}), past the attention kernels' tested range of "
            f"{limit:,} (kernels/README.md): `gem train` refuses this window unless --set {OVERRIDE}=true; "
            f"rebuild with --set max_seq_len={limit} to keep each history's last {limit:,} events")


def window_longest(features: str) -> tuple[int, int]:
    """(max_seq_len, longest stored history, an upper bound) of a features directory,
    from its manifest and report.json; of ``synthetic://...?max_seq_len=L``, (L, L)."""
    if features.startswith(SYNTHETIC):
        query = features[len(SYNTHETIC):].partition("?")[2]
        opts = dict(item.split("=", 1) for item in query.split("&") if "=" in item)
        try:
            length = int(opts.get("max_seq_len", 16))
        except ValueError:
            return 0, 0  # make_loader names the bad option
        return length, length
    from gem.features.loader import read_manifest

    max_seq_len = int(read_manifest(features)["spec"]["max_seq_len"])
    try:
        report = json.loads((Path(features) / "report.json").read_text())
    except (OSError, ValueError):
        return max_seq_len, max_seq_len
    return max_seq_len, min(max_seq_len, longest_stored(report.get("sequence_length") or {}))


def check_sequence_lengths(features: str, allow: bool) -> int:
    """Refuse (ConfigError, exit 2, one line) before any work a window whose histories may
    be longer than MAX_TESTED_SEQ_LEN, unless ``allow``; returns the longest history."""
    from gem.config import ConfigError

    max_seq_len, longest = window_longest(features)
    limit = MAX_TESTED_SEQ_LEN
    if longest > limit and not allow:
        way = (f"generate them with max_seq_len={limit}" if features.startswith(SYNTHETIC)
               else f"rebuild the features with --set max_seq_len={limit}")
        raise ConfigError(
            f"{features}: histories of up to {longest:,} events (the window's max_seq_len {max_seq_len:,}) are longer "
            f"than the attention kernels' tested range of {limit:,} events (kernels/README.md; one step could take "
            f"minutes and not stop on Ctrl-C): {way}, or train anyway with --set {OVERRIDE}=true")
    return longest
