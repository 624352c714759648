"""Shared fixtures: one weights cache per test session, outside the repository, and course
directories made from the real template."""

import os
from pathlib import Path

# the oracle in this process runs on one BLAS thread too (set before NumPy loads): the suite's
# processes then share the cores instead of spinning idle threads against each other
for _name in ("OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_name, "1")

import pytest  # noqa: E402

from tests.helpers import make_course, reference_text  # noqa: E402


@pytest.fixture(scope="session", autouse=True)
def weights_cache(tmp_path_factory) -> Path:
    """THEINFERENCE_CACHE_DIR for the whole session (the synthetic weights are made once).
    THEINFERENCE_TEST_CACHE reuses a directory across sessions."""
    chosen = os.environ.get("THEINFERENCE_TEST_CACHE")
    path = Path(chosen) if chosen else tmp_path_factory.mktemp("theinference-cache")
    os.environ["THEINFERENCE_CACHE_DIR"] = str(path)
    return path


@pytest.fixture(scope="session")
def weights(weights_cache):
    from theinference.oracle.weights import load_weights

    return load_weights("synthetic", Path("."))


@pytest.fixture
def template_course(tmp_path) -> Path:
    return make_course(tmp_path / "course")


@pytest.fixture
def reference_course(tmp_path) -> Path:
    return make_course(tmp_path / "course", reference_text())
