"""Issue 42 cases: refusals across the CLI, the refresh scheduler, empty outputs, machine failures.
Registered into tests.reliability.cases.CASES (Case, kinds and _R there)."""

from __future__ import annotations

CASES: tuple = ()
