"""The machine's rate, measured once for a stage's measured calls that follow each other."""

import types

from theinference.course.languages import by_name
from theinference.student import calibration


def fake_process(course: str, reach=(), rates=None):
    sandbox = types.SimpleNamespace(kind="bwrap")
    setup = types.SimpleNamespace(sandbox=sandbox, rates=rates)
    return types.SimpleNamespace(course_dir=course, setup=setup, language=by_name("python"),
                                 install_reach=reach)


def test_a_rate_a_run_measured_serves_the_next_run_of_the_same_cache(monkeypatch, tmp_path):
    """Catches every `theinference test` measuring the machine again (a second of CPU beside
    a stage's cost proof, a save after a save), a kept rate served past FRESH_FOR or to another
    course, and a rate memo written without the cache's secret believed (a student's process
    that wrote a slower machine's rate would loosen every floor)."""
    from theinference.grading.digests import RATES_FILE, SignedRates

    measured = []
    monkeypatch.setattr(calibration, "measure",
                        lambda process: measured.append(process.course_dir) or (90e9, ""))
    now = [1.0e9]
    monkeypatch.setattr(calibration.time, "time", lambda: now[0])
    for run in range(2):  # two grader processes: nothing kept in memory between them
        monkeypatch.setattr(calibration, "_MEASURED", {})
        rate = calibration.rate_now(fake_process("/a", rates=SignedRates(tmp_path)))
        assert rate == (90e9, ""), run
    assert measured == ["/a"], "the second run measured again"
    monkeypatch.setattr(calibration, "_MEASURED", {})
    calibration.rate_now(fake_process("/b", rates=SignedRates(tmp_path)))
    assert measured == ["/a", "/b"], "a rate served to another course"
    now[0] += calibration.FRESH_FOR
    monkeypatch.setattr(calibration, "_MEASURED", {})
    calibration.rate_now(fake_process("/a", rates=SignedRates(tmp_path)))
    assert measured == ["/a", "/b", "/a"], "a rate served past FRESH_FOR"
    forged = (tmp_path / RATES_FILE).read_bytes().replace(b"90000000000.0", b"10000000000.0")
    (tmp_path / RATES_FILE).write_bytes(forged)
    monkeypatch.setattr(calibration, "_MEASURED", {})
    calibration.rate_now(fake_process("/a", rates=SignedRates(tmp_path)))
    assert measured == ["/a", "/b", "/a", "/a"], "a memo changed without the secret believed"


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


def test_a_rate_measured_in_the_callers_thread_keeps_no_other_course_waiting(monkeypatch):
    """Catches rate_soon measuring under its lock (where the grader's BLAS has threads, the
    measure runs in the caller's thread): a second course's try, asking for its own rate from
    another thread, waited for the first course's whole calibration."""
    import threading

    release, asked = threading.Event(), []
    monkeypatch.setattr(calibration, "_SOON", {})

    def slow_for_a(process, fresh_for=calibration.FRESH_FOR):
        asked.append(process.course_dir)
        if process.course_dir == "/a":
            release.wait(timeout=30)
        return 90e9, ""

    monkeypatch.setattr(calibration, "rate_now", slow_for_a)
    first = threading.Thread(target=calibration.rate_soon, args=(fake_process("/a"), False))
    first.start()
    while not asked:
        threading.Event().wait(0.01)
    other = threading.Thread(target=calibration.rate_soon, args=(fake_process("/b"), False))
    other.start()
    other.join(timeout=10)
    try:
        assert not other.is_alive() and asked == ["/a", "/b"], asked
    finally:
        release.set()
        first.join(timeout=10)


def test_a_rate_minutes_old_bounds_a_try_and_never_judges_a_floor(monkeypatch, tmp_path):
    """Catches a floor's verdict taking a rate older than FRESH_FOR (the load a measured call
    meets has moved since), and a try's budget (rate_soon with BOUNDS_FOR) measuring the
    machine again within BOUNDS_FOR, from this grader's memory or the cache's memo."""
    from theinference.grading.digests import SignedRates

    measured = []
    monkeypatch.setattr(calibration, "measure",
                        lambda process: measured.append(process.course_dir) or (90e9, ""))
    monkeypatch.setattr(calibration, "_MEASURED", {})
    monkeypatch.setattr(calibration, "_SOON", {})
    clock, now = [1000.0], [1.0e9]
    monkeypatch.setattr(calibration.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(calibration.time, "time", lambda: now[0])
    process = fake_process("/a", rates=SignedRates(tmp_path))
    calibration.rate_now(process)
    clock[0] += 5 * calibration.FRESH_FOR
    now[0] += 5 * calibration.FRESH_FOR
    soon = calibration.rate_soon(process, False, fresh_for=calibration.BOUNDS_FOR)
    assert soon.wait() == 90e9 and measured == ["/a"], "a try measured again"
    monkeypatch.setattr(calibration, "_MEASURED", {})  # the next run: the memo alone
    soon = calibration.rate_soon(process, False, fresh_for=calibration.BOUNDS_FOR)
    assert soon.wait() == 90e9 and measured == ["/a"], "a try measured despite the memo"
    calibration.rate_now(process)
    assert measured == ["/a", "/a"], "a floor took a rate past FRESH_FOR"
    clock[0] += calibration.BOUNDS_FOR
    now[0] += calibration.BOUNDS_FOR
    calibration.rate_soon(process, False, fresh_for=calibration.BOUNDS_FOR).wait()
    assert measured == ["/a", "/a", "/a"], "a try took a rate past BOUNDS_FOR"
