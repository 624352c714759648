"""A save's cost, stage by stage: the grader against the student's own code called directly.

For each stage, on a course holding the reference solution (passing) and the reference with
one of the stage's classic bugs planted (failing), it times, side by side in one sitting:

- own: the stage's cases called in-process, one after another, with one BLAS thread, no grader
  (the student's own work: the same cases, drawn from the same seed), the faster of two runs,
  one before the grader's and one after;
- cold, second and warm: `theinference test --stage S --seed N` with an empty answer cache,
  then again with the answers the first run kept (the second run also reads the weights whole
  once, to learn each tensor's digest, which the first does not stop for), then once more: the
  student's loop from then on (the synthetic weights are made before any);
- from the grader's JSON: the student's CPU in the grader, the oracle's and the grader's own
  seconds;
- watch: in `theinference test --watch`, save -> the stage's first verdict line (the bug
  planted into a passing course, then fixed).

- course (--course): one cold `theinference test` of every stage against the student's own
  work on all their cases.
- solutions (--solutions): other correct solutions of tests/solutions (their layouts, their
  arithmetic), passing, warm against their own work: the oracle's answers are the same for
  every correct solution, so one warm cache serves them all.

    python benchmarks/save_speed.py [--stages full-decode-step ...] [--no-watch] [--course]
                                    [--solutions independent_kvcache.py paged_kvcache.py ...]

`--seed` adds the stages' two hidden cases to every run alike (own work included), so the
drawn cases are the same on both sides. The figures are seconds of wall time unless said;
ratios compare the columns of one row, taken minutes apart on the same machine.
"""

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.watch_latency import start_watcher, wait_for  # noqa: E402
from tests.bugs import BUGS, planted  # noqa: E402
from tests.helpers import make_course, reference_text  # noqa: E402

SEED = 20261203
# the child that calls the adapters directly: the student's own work, no grader around it
OWN_WORK = r"""
import json, sys, time
sys.path.insert(0, sys.argv[1])
calls = json.loads(sys.stdin.read())
from tests import adapters
started, cpu = time.monotonic(), time.process_time()
for name, args in calls:
    try:
        getattr(adapters, name)(*args)
    except Exception:
        pass  # a refusal, or the planted bug's error: its cost counts all the same
print(json.dumps({"wall": time.monotonic() - started, "cpu": time.process_time() - cpu}))
"""


def stage_calls(slug: str, config) -> list:
    """(adapter, args) of every case the grader runs for `slug` with --seed SEED."""
    from theinference.curriculum.checks import CHECKS
    from theinference.curriculum.stages import (
        load_stages,
        select,
        with_hidden_cases,
        with_run_draws,
    )

    (stage,) = select(load_stages(), [slug])
    stage = with_run_draws(with_hidden_cases(stage, SEED), SEED)
    return [(CHECKS[c.check].adapter, CHECKS[c.check].arguments(c, config)) for c in stage.cases]


def own_work(course: Path, calls: list, weights: Path) -> dict:
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
           "THEINFERENCE_WEIGHTS": str(weights)}
    done = subprocess.run([sys.executable, "-c", OWN_WORK, str(course)], input=json.dumps(calls),
                          capture_output=True, text=True, env=env, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def graded(course: Path, slug: str | None, cache: Path, out: Path) -> dict:
    """One `theinference test` of a stage (of every stage: None), timed."""
    started = time.monotonic()
    stage = ["--stage", slug] if slug else []
    subprocess.run(
        [sys.executable, "-m", "theinference", "test", "-C", str(course), *stage,
         "--seed", str(SEED), "--format", "json", "--output", str(out)],
        capture_output=True, env={**os.environ, "THEINFERENCE_CACHE_DIR": str(cache)},
    )
    result = json.loads(out.read_text())
    status = ", ".join(sorted({s["status"] for s in result["stages"]}))
    return {"wall": time.monotonic() - started, "status": status, **result["timings"]}


def fresh_cache(tmp: Path, weights_from: Path, name: str) -> Path:
    """A cache directory holding the weights alone: the oracle's answers start cold."""
    cache = tmp / name
    shutil.rmtree(cache, ignore_errors=True)
    cache.mkdir()
    for made in weights_from.glob("*.safetensors"):
        os.link(made, cache / made.name)
    return cache


def watch_latency(tmp: Path, slug: str, failing: str, cache: Path) -> tuple[float, float]:
    """(save of the bug -> first verdict line, save of the fix -> first verdict line)."""
    course = make_course(tmp / f"watch-{slug}", reference_text())
    os.environ["THEINFERENCE_CACHE_DIR"] = str(cache)
    proc = start_watcher(course, slug)
    pattern = re.compile(rf"{re.escape(slug)}\b.*\b(PASSED|FAILED|ERROR|TIMEOUT)\b")
    lines: list = []
    import queue

    feed: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [feed.put(x) for x in proc.stdout], daemon=True).start()
    try:
        wait_for(feed, pattern, 900)
        wait_for(feed, re.compile("watching for changes"), 900)
        times = []
        for text in (failing, reference_text()):
            time.sleep(1.0)
            saved = time.monotonic()
            (course / "src" / "kvcache.py").write_text(text + "\n# saved\n")
            elapsed, line = wait_for(feed, pattern, 900, since=saved)
            lines.append(line.strip())
            times.append(elapsed)
            wait_for(feed, re.compile("watching for changes"), 900)
    finally:
        proc.kill()
    return times[0], times[1]


def main() -> None:
    from theinference.oracle.weights import load_weights

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stages", nargs="*", default=None)
    parser.add_argument("--no-watch", action="store_true")
    parser.add_argument("--course", action="store_true",
                        help="also a cold first run of the whole course against its own work")
    parser.add_argument("--solutions", nargs="*", default=[],
                        help="tests/solutions files timed warm, passing, against their own work")
    options = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        made = tmp / "weights"
        made.mkdir()
        os.environ["THEINFERENCE_CACHE_DIR"] = str(made)
        weights = load_weights("synthetic", Path("."))
        slugs = options.stages or list(dict.fromkeys(b.stage for b in BUGS))
        if options.solutions:
            other_solutions(tmp, made, weights, order(slugs), options.solutions)
            return
        print(f"seed {SEED}; wall seconds unless said; own = the cases called directly, "
              "one BLAS thread")
        print(f"{'stage':<22}{'kind':<5}{'own':>7}{'cold':>7}{'second':>7}{'warm':>7}"
              f"{'warm/own':>9}"
              f"{'student':>8}{'oracle':>7}{'grader':>7}  status")
        totals = {"own": 0.0, "cold": 0.0, "warm": 0.0}
        for slug in order(slugs):
            calls = stage_calls(slug, weights.config)
            bug = next(b.id for b in BUGS if b.stage == slug)
            for kind, text in (("pass", reference_text()), ("fail", planted(bug))):
                course = make_course(tmp / f"{slug}-{kind}", text)
                own = own_work(course, calls, weights.path)
                cache = fresh_cache(tmp, made, f"cache-{slug}-{kind}")
                cold = graded(course, slug, cache, tmp / "cold.json")
                second = graded(course, slug, cache, tmp / "warm.json")
                warm = graded(course, slug, cache, tmp / "warm.json")
                # the student's own work again, after the grader's runs: the faster of the two
                # (a fresh process's first touches of memory cost what the host makes them, from
                # one minute to the next: one sitting read the same calls 10.2 s, then 14.4 s)
                own = min(own, own_work(course, calls, weights.path), key=lambda o: o["wall"])
                if kind == "pass":
                    for key, value in (("own", own["wall"]), ("cold", cold["wall"]),
                                       ("warm", warm["wall"])):
                        totals[key] += value
                print(f"{slug:<22}{kind:<5}{own['wall']:>7.1f}{cold['wall']:>7.1f}"
                      f"{second['wall']:>7.1f}{warm['wall']:>7.1f}"
                      f"{warm['wall'] / own['wall']:>8.2f}x"
                      f"{warm['student_seconds']:>8.1f}{warm['oracle_seconds']:>7.1f}"
                      f"{warm['grader_seconds']:>7.1f}  {warm['status']}"
                      + (f" ({bug})" if kind == "fail" else ""), flush=True)
            if not options.no_watch:
                failing, fixed = watch_latency(tmp, slug, planted(bug), made)
                print(f"{slug:<22}watch: save -> first verdict, bug {failing:.2f} s, "
                      f"fix {fixed:.2f} s", flush=True)
        print(f"the stages one by one, passing: own {totals['own']:.1f} s, cold "
              f"{totals['cold']:.1f} s ({totals['cold'] / totals['own']:.2f}x), warm "
              f"{totals['warm']:.1f} s ({totals['warm'] / totals['own']:.2f}x)")
        if options.course:
            whole_course(tmp, made, weights)


def whole_course(tmp: Path, made: Path, weights) -> None:
    """A first run of the whole course, cold (an empty answer cache), against the student's
    own work on every stage's cases in one process."""
    course = make_course(tmp / "whole-course", reference_text())
    calls = [call for slug in order(list(dict.fromkeys(b.stage for b in BUGS)))
             for call in stage_calls(slug, weights.config)]
    own = own_work(course, calls, weights.path)
    cold = graded(course, None, fresh_cache(tmp, made, "cache-course"), tmp / "course.json")
    print(f"whole course, one cold run: own {own['wall']:.1f} s, cold {cold['wall']:.1f} s "
          f"({cold['wall'] / own['wall']:.2f}x); student {cold['student_seconds']:.1f}, oracle "
          f"{cold['oracle_seconds']:.1f}, grader {cold['grader_seconds']:.1f}  {cold['status']}")


def other_solutions(tmp: Path, made: Path, weights, slugs: list[str], names: list[str]) -> None:
    """Each solution's warm passing run of each stage against its own work; the cache made
    warm once per stage by the reference (a correct solution's answers are the oracle's)."""
    from tests.helpers import SOLUTIONS, with_template_stubs

    print(f"{'stage':<22}{'solution':<28}{'own':>7}{'warm':>7}{'warm/own':>9}  status")
    for slug in slugs:
        calls = stage_calls(slug, weights.config)
        cache = fresh_cache(tmp, made, f"cache-{slug}-solutions")
        warming = make_course(tmp / f"{slug}-warming", reference_text())
        for _ in range(2):  # cold, then the run that reads the weights whole once
            graded(warming, slug, cache, tmp / "warming.json")
        for name in names:
            text = with_template_stubs((SOLUTIONS / name).read_text())
            course = make_course(tmp / f"{slug}-{name}", text)
            try:
                own = own_work(course, calls, weights.path)
            except subprocess.CalledProcessError as failed:  # not a course on its own
                last = (failed.stderr.strip().splitlines() or ["no output"])[-1]
                print(f"{slug:<22}{name:<28}  its own work failed: {last}", flush=True)
                continue
            warm = graded(course, slug, cache, tmp / "warm.json")
            print(f"{slug:<22}{name:<28}{own['wall']:>7.1f}{warm['wall']:>7.1f}"
                  f"{warm['wall'] / own['wall']:>8.2f}x  {warm['status']}", flush=True)


def order(slugs: list[str]) -> list[str]:
    from theinference.curriculum.stages import load_stages

    known = [s.slug for s in load_stages()]
    return sorted(slugs, key=known.index)


if __name__ == "__main__":
    main()
