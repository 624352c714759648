"""The machine's rate, measured once for a stage's measured calls that follow each other."""

import types

from theinference.course.languages import by_name
from theinference.student import calibration


def fake_process(course: str, reach=()):
    sandbox = types.SimpleNamespace(kind="bwrap")
    return types.SimpleNamespace(course_dir=course, setup=types.SimpleNamespace(sandbox=sandbox),
                                 language=by_name("python"), install_reach=reach)


def test_a_rate_measured_moments_ago_serves_the_next_measured_call(monkeypatch):
    """Catches a calibration process started again for every measured call of a run (seconds
    of a failing or passing try spent measuring the same machine twice), and a rate kept past
    FRESH_FOR or handed to another course."""
    measured = []
    monkeypatch.setattr(calibration, "_MEASURED", {})
    monkeypatch.setattr(calibration, "measure",
                        lambda process: measured.append(process.course_dir) or (90e9, ""))
    clock = [1000.0]
    monkeypatch.setattr(calibration.time, "monotonic", lambda: clock[0])
    assert calibration.rate_now(fake_process("/a")) == (90e9, "")
    clock[0] += 10
    assert calibration.rate_now(fake_process("/a")) == (90e9, "") and measured == ["/a"]
    calibration.rate_now(fake_process("/b"))
    clock[0] += calibration.FRESH_FOR
    calibration.rate_now(fake_process("/a"))
    assert measured == ["/a", "/b", "/a"]


def test_a_kept_rate_is_never_given_where_none_can_be_trusted(monkeypatch):
    """Catches a kept rate handed to a call whose student's process can now write the grader's
    installation: the rate is refused every time, kept or not."""
    monkeypatch.setattr(calibration, "_MEASURED", {})
    monkeypatch.setattr(calibration, "measure", lambda process: (90e9, ""))
    assert calibration.rate_now(fake_process("/a"))[0] == 90e9
    monkeypatch.setattr(calibration.reach, "why", lambda found: "the install is writable")
    rate, why = calibration.rate_now(fake_process("/a", reach=("site-packages",)))
    assert rate is None and why == "the install is writable"
