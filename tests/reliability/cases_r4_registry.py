"""Issue 42 cases: a student's knowledge lineage, the registry's invariants, new fault points.
Registered into tests.reliability.cases.CASES (Case, kinds and _R there)."""

from __future__ import annotations

CASES: tuple = ()
