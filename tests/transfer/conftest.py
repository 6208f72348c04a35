import pytest

from tests.students.fixtures import tiny_world


@pytest.fixture(scope="session")
def world(tmp_path_factory):
    """Simulator data, feature windows, a registered GEM teacher, its knowledge in Feast
    (built once per test session, shared by tests/knowledge and tests/students)."""
    return tiny_world(tmp_path_factory.mktemp("transfer"))
