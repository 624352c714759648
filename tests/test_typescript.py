"""The TypeScript course: its template, the Node worker, the language switch, and the
TypeScript reference and planted bugs graded through the same stages as Python.

These need Node and the runner `.ci/run` installs once (`npm ci --prefix tests/fixtures/ts_runner`);
each course directory links that node_modules, so nothing here touches the network.
"""

import json
import os
import shutil
import subprocess
import sys
import tomllib
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from tests import ts_shapes
from theinference.course import languages
from theinference.course.directory import CourseError, course_language, init_course, open_course
from theinference.curriculum.stages import load_stages, select
from theinference.grading.policy import is_long, is_swap
from theinference.grading.verify import Grounds, load_bugs, quick, verify_bug, verify_reference
from theinference.grading.watching import is_watched
from theinference.student import launch
from theinference.student.process import StudentProcess
from theinference.student.setup import Limits, ProcessSetup

SOLUTIONS_TS = Path(__file__).parent / "solutions_ts"
REFERENCE_TS = (SOLUTIONS_TS / "reference_kvcache.ts").read_text()
BUGS_TS = {b.id: b for b in load_bugs(SOLUTIONS_TS / "bugs.toml")}
NODE_MODULES = Path(
    os.environ.get("THEINFERENCE_NODE_MODULES")
    or Path(__file__).parent / "fixtures" / "ts_runner" / "node_modules"
)
CLASSIC = [  # the bugs the issue names, and the fingerprint each must be named by
    "decode-position-zero",
    "attend-old-length",
    "shared-cache",
    "missing-ln-f",
    "prefill-cache-short",
    "decode-recomputes",
]


@pytest.fixture(scope="session", autouse=True)
def ts_runner():
    """Fails (does not skip) when the runner is missing: the TypeScript course is untested then."""
    assert (NODE_MODULES / "tsx" / "package.json").is_file(), (
        f"no tsx in {NODE_MODULES}: run `npm ci --prefix tests/fixtures/ts_runner` (.ci/run does)"
    )


def ts_course(
    root: Path, kvcache: str | None = None, adapters: str | None = None, copy: bool = False
) -> Path:
    """A TypeScript course with the runner linked in, or copied (a sandbox binds the course
    directory alone, so a link out of it would dangle)."""
    init_course(root, languages.TYPESCRIPT)
    if copy:
        shutil.copytree(NODE_MODULES, root / "node_modules", symlinks=True)
    else:
        (root / "node_modules").symlink_to(NODE_MODULES)
    if kvcache is not None:
        (root / "src" / "kvcache.ts").write_text(kvcache)
    if adapters is not None:
        (root / "tests" / "adapters.ts").write_text(adapters)
    return root


def cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "theinference", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env={**os.environ, "COLUMNS": "200"},
    )


def test_init_lang_ts_writes_a_typescript_course(tmp_path):
    """Catches a template that is not shipped, a runtime dependency, or a silent npm step."""
    done = cli("init", str(tmp_path / "c"), "--lang", "ts")
    assert done.returncode == 0, done.stderr
    assert "npm install" in done.stdout
    package = json.loads((tmp_path / "c" / "package.json").read_text())
    assert package["type"] == "module" and "dependencies" not in package
    assert package["devDependencies"]["tsx"][0].isdigit()  # pinned, not a range
    settings = tomllib.loads((tmp_path / "c" / "theinference.toml").read_text())
    assert settings["language"] == "ts"
    for rel in ("src/gpt2.ts", "src/kvcache.ts", "tests/adapters.ts", "tsconfig.json"):
        assert (tmp_path / "c" / rel).is_file(), rel


def test_a_course_without_its_runner_is_refused_with_the_fix(tmp_path):
    """Catches a traceback (or a hang) instead of the `npm install` a student must run."""
    init_course(tmp_path / "c", languages.TYPESCRIPT)
    done = cli("test", "-C", str(tmp_path / "c"))
    assert done.returncode == 3
    assert "npm install" in done.stderr and "Traceback" not in done.stderr + done.stdout


def test_language_found_from_settings_or_adapters(tmp_path):
    """Catches a course graded by the wrong worker (or its worker started without its mode and
    the hooks spelled its way), and a bad language value accepted."""
    (tmp_path / "a" / "tests").mkdir(parents=True)
    (tmp_path / "a" / "tests" / "adapters.ts").write_text("")
    assert course_language(tmp_path / "a") is languages.TYPESCRIPT
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "theinference.toml").write_text('language = "ts"\n')
    assert course_language(tmp_path / "b") is languages.TYPESCRIPT
    (tmp_path / "b" / "theinference.toml").write_text('language = "rust"\n')
    with pytest.raises(CourseError, match="must be one of python, ts"):
        open_course(tmp_path / "b")
    argv = launch.worker_argv(tmp_path / "a", (3, 4), 2**30, course_language(tmp_path / "a"))
    assert "--max-old-space-size=1024" in argv and argv[-6:] == [
        "3",
        "4",
        str(tmp_path / "a"),
        str(2**30),
        "adapters",
        "prefill,attnStep",  # the hooks, as the course spells them (the Node worker's to wrap)
    ]


def test_the_worker_starts_node_able_to_run_the_fused_kernel(tmp_path):
    """Catches the student's Node started without relaxed SIMD where it needs the flag (Node 20:
    the course's kernel-fma.wasm then goes unused, and TypeScript is slower for it), or with a
    flag this Node refuses (every TypeScript course would fail to start)."""
    argv = launch.worker_argv(tmp_path, (3, 4), 2**30, language=languages.TYPESCRIPT)
    flags = [a for a in argv if a == launch.RELAXED_SIMD_FLAG]
    major = node_major()
    fused = languages.TYPESCRIPT.template / launch.FUSED_KERNEL
    done = subprocess.run([argv[0], *flags, "-e", launch.VALIDATES, str(fused)],
                          capture_output=True, text=True, timeout=60)
    # every Node the course supports here (20 on) runs it, with the flag or without
    assert done.returncode == (0 if major >= 20 else 1), (major, argv, done.stderr)
    if major == 20:
        assert flags, argv


def node_major() -> int:
    done = subprocess.run(["node", "-p", "process.versions.node"], capture_output=True,
                          text=True, timeout=60, check=True)
    return int(done.stdout.split(".")[0])


def test_a_course_without_the_fused_kernel_gets_no_floor(tmp_path):
    """Catches the floor measured in a course whose kernel-fma.wasm was removed or replaced:
    the calibration could then run another binary than the one the student's process picks."""
    from types import SimpleNamespace

    from theinference.student import calibration

    course = ts_course(tmp_path / "c")
    (course / "src" / "kernel-fma.wasm").unlink()
    process = SimpleNamespace(course_dir=course, language=languages.TYPESCRIPT)
    rate, why = calibration.measure(process)
    assert rate is None and "src/kernel-fma.wasm is not the provided one" in why


def test_stubs_are_todo_naming_their_stage(tmp_path, weights):
    """Catches the not-implemented error reported as a crash, or todo without the stage."""
    course = ts_course(tmp_path / "c")
    stages = [quick(s) for s in load_stages()]
    from theinference.grading.grader import RunPlan, grade

    run = grade(ProcessSetup(course, weights.path), RunPlan(stages, weights))
    for stage in run.stages:
        assert stage.status.value == "todo", (stage.slug, stage.cases[0].message)
    decode = next(s for s in run.stages if s.slug == "full-decode-step")
    assert "build-prefill: implement prefill in src/kvcache.ts" in decode.cases[0].message


ADAPTERS_PROBE = """
import { helper } from "../src/kvcache.ts";

interface Unused {
  a: number;
  b: string;
}
type AlsoUnused = { c: number };

export function runStepAttention(seqIds: number[]) {
  return helper(seqIds);
}
export async function runPrefill(promptIds: number[]) {
  return [new Float32Array([1.5, 2]), promptIds.length];
}
export function runPrefillCache(a: number[], b: number[]) {
  return 0;
}
export function runGenerate(promptIds: number[], n: number) {
  throw new RangeError("too long");
}
"""
KVCACHE_PROBE = """
type Pad = {
  x: number;
};

export function helper(ids: number[]): number {
  const rows: Pad[] = [];
  throw new TypeError(`bad ids ${ids.length}`);
}
"""


def test_worker_outcomes_values_and_student_stack(tmp_path, weights):
    """Catches transpiled line numbers in the stack, grader frames left in it, Promises not
    awaited, pairs not described item by item, a missing adapter or a wrong arity accepted, and
    a RangeError not counted as the refusal the grader asks for."""
    course = ts_course(tmp_path / "c", KVCACHE_PROBE, ADAPTERS_PROBE)
    with StudentProcess(ProcessSetup(course, weights.path, Limits(timeout=60))) as worker:
        raised = worker.call("run_step_attention", [[1, 2, 3]])
        pair = worker.call("run_prefill", [[7, 8]])
        arity = worker.call("run_prefill_cache", [[1]])
        missing = worker.call("run_decode_step", [[1], 2])
        refused = worker.call("run_generate", [[1], 2000])
    assert raised.kind == "raised" and raised.exception == "TypeError"
    assert "TypeError: bad ids 3" in raised.message
    assert "(src/kvcache.ts:8:9)" in raised.traceback  # the .ts line, not the compiled one
    assert "throw new TypeError" in raised.traceback
    assert "(tests/adapters.ts:11:" in raised.traceback
    assert "node_modules" not in raised.traceback and "worker_node" not in raised.traceback
    assert pair.kind == "returned"
    logits, count = pair.value
    assert logits.dtype == "float32" and logits.tolist() == [1.5, 2.0]
    assert count.dtype.kind == "i" and int(count) == 2
    assert arity.kind == "signature" and missing.kind == "missing"
    assert "runDecodeStep" in missing.message
    assert refused.kind == "raised" and refused.exception == "ValueError"
    assert "RangeError: too long" in refused.message


BUSY_ADAPTERS = """
export function runPrefill(ids: number[]) {
  let s = 0;
  for (let i = 0; i < 3e7; i++) s += i % 7;
  return [s];
}
"""


def test_the_grader_measures_a_typescript_call_and_its_own_product(tmp_path, weights):
    """Catches a Node worker the grader's outside CPU measure cannot see (a busy call costing
    nothing), a calibration that the TypeScript worker cannot run (every floor would fail), one
    in plain JavaScript (2-3 GFLOP/s: a floor several times too generous for a gpt2.ts that
    multiplies in the kernel, 15-25), or one through a kernel the student changed."""
    from theinference.student.calibration import measure

    course = ts_course(tmp_path / "c", adapters=BUSY_ADAPTERS)
    with StudentProcess(ProcessSetup(course, weights.path, Limits(timeout=120))) as process:
        kept = process.call("run_prefill", [[1, 2]])
        rate, why = measure(process)
    assert kept.kind == "returned" and kept.value is not None, kept.message
    assert isinstance(kept.cpu_seconds, float) and kept.cpu_seconds > 0.01
    assert rate is not None and rate > 6e9, why
    kernel = course / "src" / "kernel.ts"
    kernel.write_text(kernel.read_text() + "\n// a product slowed when it is calibrated\n")
    with StudentProcess(ProcessSetup(course, weights.path, Limits(timeout=120))) as process:
        rate, why = measure(process)
    assert rate is None and "src/kernel.ts is not the provided one" in why


def test_a_kernel_that_does_not_load_fails_the_calibration(tmp_path, weights):
    """Catches the calibration measuring a slower stand-in (plain JavaScript, ~50x slower: every
    floor that much too generous, so a recompute passes the cost checks) when the student makes
    the provided kernel fail to load there while its files stay byte for byte the template's:
    here a src/package.json Node refuses, which the student's own copies elsewhere escape."""
    from theinference.student.calibration import measure

    course = ts_course(tmp_path / "c")
    (course / "src" / "package.json").write_text("{ not json")
    with StudentProcess(ProcessSetup(course, weights.path, Limits(timeout=120))) as process:
        rate, why = measure(process)
    assert rate is None and "src/kernel.ts did not load" in why, (rate, why)


def test_an_earlier_releases_kernel_is_named_not_trusted(tmp_path):
    """Catches a course's earlier-release kernel trusted for the floor (a slower kernel measured
    makes a more lenient floor: a student could ship it beside a renamed current one), and a
    student with such a course left without the step that fixes it."""
    import hashlib
    from dataclasses import replace
    from types import SimpleNamespace

    from theinference.student import calibration

    course = ts_course(tmp_path / "c")
    process = SimpleNamespace(course_dir=course, language=languages.TYPESCRIPT)
    assert calibration.kernel_changed(process) is None  # the template's own
    ts, wasm = course / "src" / "kernel.ts", course / "src" / "kernel.wasm"
    ts.write_text(ts.read_text() + "\n// as an earlier release shipped it\n")
    digest = lambda path: hashlib.sha256(path.read_bytes()).hexdigest()  # noqa: E731
    earlier = frozenset({(digest(ts), digest(wasm))})
    process.language = replace(languages.TYPESCRIPT, earlier_kernels=earlier)
    rate, why = calibration.measure(process)
    assert rate is None and "an earlier release's" in why and "init --lang ts" in why
    wasm.write_bytes(wasm.read_bytes() + b"\0")  # that release's kernel.ts, another's wasm
    rate, why = calibration.measure(process)
    assert rate is None and "is not the provided one" in why


def test_reports_and_hint_use_the_typescript_names(tmp_path):
    """Catches Python names (decode_step, len(prompt_ids)) shown to a TypeScript student."""
    course = ts_course(tmp_path / "c")
    done = cli("hint", "full-decode-step", "-C", str(course))
    assert done.returncode == 0, done.stderr
    assert "decodeStep" in done.stdout and "promptIds.length" in done.stdout
    assert "decode_step" not in done.stdout and "len(prompt_ids)" not in done.stdout
    python = cli("hint", "full-decode-step", "-C", str(tmp_path))
    assert "decode_step" in python.stdout


PYTHON_IDIOMS = ["LayerCache()", "for _ in", "reshape(", ".transpose(", " @ ", "None", "NumPy"]


def test_every_bugs_words_in_typescript_quote_no_python():
    """Catches a TypeScript student told about [LayerCache() for _ in range(n)],
    reshape(...).transpose(1, 0, 2), q @ k, None or NumPy arrays: a bug whose Python words quote
    Python needs its `ts` words in diagnosis/bugs.toml."""
    from theinference.diagnosis.bugs import bug_table

    for bug in bug_table().values():
        words = languages.TYPESCRIPT.localize(f"{bug.name('ts')} {bug.hint('ts')}")
        assert not [i for i in PYTHON_IDIOMS if i in words], (bug.id, words)


def test_a_course_with_its_own_runner_runs_as_a_dropped_uid(tmp_path, weights):
    """Catches the copy a dropped uid reads (a course in a folder others cannot enter) losing
    the exec bit of node_modules' esbuild: every TypeScript import then fails with EACCES."""
    from tests.test_containment import require_unprivileged

    tmp_path.chmod(0o700)  # others cannot read the course: the uid gets a copy
    course = ts_course(tmp_path / "c", REFERENCE_TS, copy=True)
    dropped = require_unprivileged()
    with StudentProcess(ProcessSetup(
            course, weights.path, Limits(timeout=60), sandbox=dropped)) as process:
        out = process.call("run_step_attention", [[464, 2068]])
    assert out.kind == "returned", out.message
    assert np.asarray(out.value).shape == (768,)


def test_watch_reacts_to_typescript_files():
    """Catches a watcher that ignores .ts saves or rebuilds on node_modules churn."""
    assert is_watched(Path("src/kvcache.ts")) and is_watched(Path("tests/adapters.ts"))
    assert not is_watched(Path("node_modules/tsx/dist/index.ts"))


def test_typescript_reference_passes_every_stage_on_small_cases(weights, answers):
    """Catches the Node worker or template mangling correct answers (shapes, dtypes, pairs),
    and the probe flagging a decode that does read its cache."""
    stages = [quick(s) for s in load_stages()]
    rows = verify_reference(REFERENCE_TS, stages, Grounds(weights, answers, SOLUTIONS_TS))
    assert [r.stage for r in rows] == [s.slug for s in stages]
    assert all(r.ok for r in rows), [(r.stage, r.status.value, r.named) for r in rows]


@pytest.mark.parametrize("bug_id", CLASSIC)
def test_classic_typescript_bug_fails_and_is_named(bug_id, weights, answers):
    """Catches a TypeScript bug that passes, or is named differently from Python's, because of
    the worker's encoding (the fingerprints run on the returned numbers only)."""
    bug = BUGS_TS[bug_id]
    (stage,) = select(load_stages(), [bug.stage])
    grounds = Grounds(weights, answers, SOLUTIONS_TS)
    row = verify_bug(bug, REFERENCE_TS, quick(stage), grounds)
    assert row.ok, (row.status.value, row.named, bug.fingerprint)


def full_size_only(stage):
    """The cases a quick run leaves out or draws short: the long ones and the proofs at the
    size the stage draws them (the rest: test_typescript_reference_passes_every_stage_on_
    small_cases)."""
    return replace(stage, cases=tuple(c for c in stage.cases if is_long(c) or is_swap(c)))


@pytest.mark.slow
def test_typescript_reference_passes_every_full_stage(weights, answers):
    """Catches the full cases (1024 tokens, position 1023) timing out or failing in TS."""
    grounds = Grounds(weights, answers, SOLUTIONS_TS)
    stages = [s for s in map(full_size_only, load_stages()) if s.cases]
    assert len(stages) == len(load_stages())  # every stage has a case at full size
    rows = verify_reference(REFERENCE_TS, stages, grounds)
    assert all(r.ok for r in rows), [(r.stage, r.status.value) for r in rows]


def test_watch_regrades_on_a_typescript_save(tmp_path):
    """Catches a watcher blind to .ts saves, or one that keeps grading the stale stub."""
    from tests.test_watch import RUN_DONE, Watcher

    course = ts_course(tmp_path / "c", copy=True)
    w = Watcher(course, "--case", "two tokens", "--timeout", "300")
    try:
        assert any("TODO" in line for line in w.until(RUN_DONE, timeout=120))
        (course / "src" / "kvcache.ts").write_text(REFERENCE_TS)
        rerun = "".join(w.until(RUN_DONE, timeout=300))
        assert "src/kvcache.ts changed" in rerun and "PASSED" in rerun, rerun
    finally:
        w.close()


def test_results_are_localized_for_typescript_only():
    """Catches a run result (case and stage messages, hints) left in Python names for a
    TypeScript course, or a Python course's text rewritten."""
    from theinference.results import CaseResult, RunResult, StageResult, Status
    from theinference.results.events import StageFinished

    message = "decode_step at len(prompt_ids)"
    case = CaseResult(name="c", status=Status.FAILED, message=message, hint="x")
    stage = StageResult("s", "t", Status.FAILED, [case], hint="wire run_decode_step")
    run = RunResult([stage], "synthetic", "0" * 64)
    ts = languages.TYPESCRIPT.localize_result(run)
    assert ts.stages[0].cases[0].message == "decodeStep at promptIds.length"
    assert ts.stages[0].hint == "wire runDecodeStep"
    assert languages.PYTHON.localize_result(run) is run
    assert run.stages[0].cases[0].message == "decode_step at len(prompt_ids)"  # not mutated
    heard = []
    languages.TYPESCRIPT.localizing(heard.append)(StageFinished(stage))
    assert heard[0].result.hint == "wire runDecodeStep"  # what watch mode draws from events


def test_the_node_swap_finds_every_layout_and_writes_all_or_nothing():
    """Catches the Node swap missing a cache layout (rows in order, rows out of order, one
    growing array per head, one array per layer) or a holder of floats (plain arrays of
    numbers, float32 bits in an Int32Array, a raw ArrayBuffer, a DataView in either byte
    order, of float32 or float64 values), writing a cell into the wrong place (a guess of the
    next row taken without checking it), or writing anything when one row is missing."""
    script = Path(__file__).parent / "fixtures" / "swap_layouts.mjs"
    done = subprocess.run(["node", str(script)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    for layout in ("rows", "shuffledRows", "headBuffers", "positionsMajor", "numberRows",
                   "int32Bits", "rawBuffers", "dataViewBig", "dataViewLittle", "dataViewFloat64"):
        assert found[layout] == [True, 0], (layout, found[layout])
    assert found["partial"] == [False, 0], found["partial"]


def test_the_swap_reaches_a_typescript_cache(tmp_path, weights, answers, run_seed):
    """Catches a swap that cannot reach a TypeScript cache (Float32Array rows per head), so the
    swapped-cache proofs could not apply to a correct TypeScript solution."""
    from tests.test_cache_use import SWAPPED, grade_proofs
    from theinference.results import Status

    course = ts_course(tmp_path / "c", REFERENCE_TS)
    cases = grade_proofs(course, weights, SWAPPED, True, answers=answers, seed=run_seed)
    assert len(cases) == len(SWAPPED) == 3  # one TypeScript process for the three
    for slug, case in zip(SWAPPED, cases, strict=True):
        assert case.status == Status.PASSED, (slug, case.message)


# the reference's prefill under another name, not exported, reached through a class's
# constructor and through an exported const arrow function (so is its decode step, whose
# layers' functions are not exported either): the adapters call no function named prefill
RENAMED_TS = (
    REFERENCE_TS.replace("export function prefill(", "function fillPrompt(")
    .replace("prefill(promptIds, w, mc)", "fillPrompt(promptIds, w, mc)")
    .replace("export function blockStep(", "function blockStep(")
    .replace("export function decodeStep(", "function decodeStep(")
) + """
export class Session {
  mc: ModelCache;
  constructor(public w: Weights, promptIds: number[]) {
    this.mc = freshCache(w);
    fillPrompt(promptIds, w, this.mc);
  }
  next(tokenId: number, position: number): Float32Array {
    return decodeStep(tokenId, position, this.w, this.mc);
  }
}

export const warm = (ids: number[], w: Weights, mc: ModelCache) => fillPrompt(ids, w, mc);
export const step = (id: number, at: number, w: Weights, mc: ModelCache) =>
  decodeStep(id, at, w, mc);
"""
RENAMED_ADAPTERS = """
import { embed } from "../src/gpt2.ts";
import {
  Session, freshCache, layerAttnIncremental, loadWeights, step, warm,
} from "../src/kvcache.ts";

export async function runStepAttention(seqIds: number[]): Promise<Float32Array> {
  const w = await loadWeights();
  const out = layerAttnIncremental(embed(seqIds, w), w, 0);
  return out[out.length - 1]!;
}

export async function runDecodeStep(promptIds: number[], nextId: number): Promise<Float32Array> {
  const w = await loadWeights();
  const mc = freshCache(w);
  warm(promptIds, w, mc);
  return step(nextId, promptIds.length, w, mc);
}

export async function runDecodeSequence(promptIds: number[], continuationIds: number[]) {
  const session = new Session(await loadWeights(), promptIds);
  return continuationIds.map((id, step) => session.next(id, promptIds.length + step));
}
"""


def test_the_swap_finds_a_typescript_prefill_by_any_name(tmp_path, weights, answers, run_seed):
    """Catches a Node worker that swaps only after a function named prefill (the grader failed
    this correct cache, "no function named prefill was found"): here the prefill is a module's
    private function, reached through a class's constructor (per-step-identity) and an
    exported const arrow function (full-decode-step)."""
    course = ts_course(tmp_path / "c", RENAMED_TS, RENAMED_ADAPTERS)
    assert_the_swap_followed(course, weights, answers, run_seed)


def assert_the_swap_followed(course, weights, answers, run_seed) -> None:
    """full-decode-step's and per-step-identity's swapped proofs pass, by the answer over the
    swapped cache."""
    from tests.test_cache_use import grade_proofs
    from theinference.results import Status

    slugs = ["full-decode-step", "per-step-identity"]
    cases = grade_proofs(course, weights, slugs, True, answers=answers, seed=run_seed)
    for slug, case in zip(slugs, cases, strict=True):
        assert case.status == Status.PASSED, (slug, case.message)
        assert "followed the cache" in case.message, (slug, case.message)


def test_the_return_watch_changes_nothing_correct_code_does(tmp_path):
    """Catches the return watch's wrapping changing what correct code computes: a class made a
    proxy (its static private members through `this` threw; `o.constructor === Cls` false), a
    function's own properties lost, a thenable's `then` called by the watch, a promise replaced
    (its extra properties lost), a `const` inside a string rewritten, a constructor function's
    instances no longer its own; tests/fixtures/ts_watch/src/checks.ts runs each with the watch
    on and without it."""
    fixture = tmp_path / "ts_watch"
    shutil.copytree(Path(__file__).parent / "fixtures" / "ts_watch", fixture)
    (fixture / "node_modules").symlink_to(NODE_MODULES)
    worker = str(Path(launch.__file__).parent / "worker")
    runs = {}
    for mode in ("plain", "watched"):
        done = subprocess.run(["node", "--import", "tsx", "run.mjs", mode, worker], cwd=fixture,
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        runs[mode] = json.loads(done.stdout)
    assert len(runs["plain"]) > 30 and not any(
        str(v).startswith("ERR") for v in runs["plain"].values()), runs["plain"]
    changed = {k: (v, runs["watched"].get(k)) for k, v in runs["plain"].items()
               if runs["watched"].get(k) != v}
    assert not changed and runs["watched"].keys() == runs["plain"].keys(), changed


SHAPED = [(name, "float32") for name in ts_shapes.SHAPES] + [
    ("a cache at module level, prefilled by another name", storage)
    for storage in ("dataview64", "numbers")
]


@pytest.mark.parametrize(("shape", "storage"), SHAPED)
def test_a_typescript_cache_in_any_shape_passes_the_swap(
    shape, storage, tmp_path, weights, answers, run_seed
):
    """Catches a Node worker that sees no moment after some correct prefill (a generator's, a
    private class's, one inside the function that also decodes, an async one) or reaches no
    cache kept at module level, in a DataView of float64 values or in plain numbers; or that
    looks at so many moments that the proof times out (a module-level cache was sent to the
    grader at every helper's return: 419 s for 9 tokens)."""
    kvcache, adapters = ts_shapes.course_texts(ts_shapes.SHAPES[shape], storage)
    course = ts_course(tmp_path / "c", kvcache, adapters)
    assert_the_swap_followed(course, weights, answers, run_seed)


def test_a_typescript_forgery_in_a_classs_methods_fails(tmp_path, weights, answers, run_seed):
    """Catches a swap judged by anything but the answer: a decode that recomputes from the ids
    its prefill kept, beside a cache it filled, fails however the watch reached the cache."""
    from tests.test_cache_use import grade_proofs
    from theinference.results import Status

    course = ts_course(tmp_path / "c", *ts_shapes.course_texts(ts_shapes.FORGERY))
    (case,) = grade_proofs(course, weights, ["full-decode-step"], True, answers=answers,
                           seed=run_seed)
    assert case.status == Status.FAILED and "recompute" in case.message, case.message
