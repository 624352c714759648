"""Shared fixtures: one weights cache per test session, outside the repository, the oracle's
answers shared by every in-process grade, and course directories made from the real template.

The suite runs on every core (pytest-xdist, `--dist loadgroup --no-loadscope-reorder` in
pyproject.toml): each test goes to whichever worker is free, in the order collected, but for a
module marked `xdist_group` (one whose module-scoped fixture grades or starts something its
tests share), whose tests run together on one worker. The slow tests are collected first, so
that no long test starts last."""

import os
import secrets
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


SEED = "THEINFERENCE_TEST_SEED"


def pytest_configure(config) -> None:
    """One seed for the drawn cases (and swapped caches) of every in-process grade of a run,
    fresh for each run unless THEINFERENCE_TEST_SEED is set, the same on every worker (they
    inherit it): the same case graded twice in a run is then answered once."""
    if not hasattr(config, "workerinput"):
        os.environ.setdefault(SEED, str(secrets.randbits(63)))


def pytest_report_header(config) -> str:
    return f"drawn cases: {SEED}={os.environ[SEED]} (set it to draw this run's cases again)"


@pytest.fixture(scope="session")
def run_seed() -> int:
    """The seed of this run's drawn cases (RunPlan.seed), as the header says."""
    return int(os.environ[SEED])


@pytest.fixture(scope="session")
def answers(weights, weights_cache):
    """The oracle's answers for every in-process grade of the session (RunPlan.answers), kept
    on disk in the session's cache too: a case graded once (by any test, on any worker, or by
    an earlier session sharing THEINFERENCE_TEST_CACHE) is never recomputed. Every answer read
    back carries the cache's MAC (tests/test_hostile.py checks them)."""
    from theinference.grading.answers import Answers

    return Answers.cached(weights)


def pytest_collection_modifyitems(config, items) -> None:
    """On pytest-xdist's workers, the slow tests first (a stable sort: files keep their order
    within each half), so the long ones are spread over the workers from the start rather than
    left for the end. A run on one process keeps each file whole."""
    if hasattr(config, "workerinput"):
        items.sort(key=lambda item: item.get_closest_marker("slow") is None)


@pytest.fixture(autouse=True)
def install_out_of_reach(request, monkeypatch):
    """The grader's installation taken as out of the student's reach (student/reach.py) in
    this process, unless the test is marked `install_reach`: the suite runs its students as
    the grader's own user (`Sandbox("none")`) as root, who can write anything, so every cost
    proof of those tests would fail saying it cannot apply. The rule itself is tested in
    tests/test_grader_install.py (marked, or in a grader process of its own)."""
    if request.node.get_closest_marker("install_reach") is None:
        from theinference.student import reach

        monkeypatch.setattr(reach, "writable_install", lambda kind: ())


@pytest.fixture
def template_course(tmp_path) -> Path:
    return make_course(tmp_path / "course")


@pytest.fixture
def reference_course(tmp_path) -> Path:
    return make_course(tmp_path / "course", reference_text())
