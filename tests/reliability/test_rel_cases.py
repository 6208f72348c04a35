"""The reliability registry (cases.py) names tests that exist, once each."""

from tests.reliability.cases import CASES


def test_every_case_names_a_test_that_exists():
    """Each node's file and function exist (parametrized ids are checked by the benchmark run)."""
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    for case in CASES:
        file, _, name = case.node.partition("::")
        tree = ast.parse((root / file).read_text())
        names = {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}
        assert name.split("[")[0] in names, case
    assert len({c.id for c in CASES}) == len(CASES)
