"""`theinference grade`: a class of submissions, each graded by `theinference test` in a process
of its own (so a submission that crashes, hangs or floods costs only its own row), several at
once but never more than the allocation's CPUs and memory allow (grading/allocation.py: the
affinity, cgroup quota and memory limit, not the node), its CPUs shared out among the jobs as
BLAS threads, and none graded twice for the same content.
"""

import hashlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

from theinference.classroom.intake import (
    IntakeError,
    Submission,
    content_hash,
    lay_over_template,
    own_code,
    read_files,
    remove_tree,
    submission_language,
)
from theinference.classroom.records import FINAL, read_record, record_path, stage_rows
from theinference.course.languages.runner import RunnerError
from theinference.course.settings import Grading
from theinference.grading.allocation import Allocation, read_allocation
from theinference.grading.provenance import provenance, with_run
from theinference.grading.seed import NO_SEED, SEED_VAR, Seed
from theinference.oracle.weights import cache_dir
from theinference.results import RunResult
from theinference.results.json_form import read_run
from theinference.results.reading import ResultsError
from theinference.results.submission import Record

STDERR_KEPT = 4000


@dataclass(frozen=True)
class Plan:
    """Everything that decides a grade; its key changes whenever any of it does."""

    weights: str
    points: dict  # slug -> max score, in course order: the stages graded
    grading: Grading = field(default_factory=Grading)
    seed: Seed = NO_SEED  # the hidden cases' seed and its source (grading/seed.py)
    cases: tuple[str, ...] = ()
    memory_bytes: int = 8 << 30
    settings_toml: bytes | None = None  # the instructor's theinference.toml
    submission_timeout: float = 1800.0  # a backstop: every call has its own timeout
    weights_sha256: str = ""  # the weights `weights` names, as loaded when grading began

    def key(self) -> str:
        fields = asdict(self)
        fields["settings_toml"] = (self.settings_toml or b"").decode(errors="replace")
        fields["provenance"] = self.provenance()  # a spec edited in place regrades too
        return hashlib.sha256(json.dumps(fields, sort_keys=True, default=str).encode()).hexdigest()

    def provenance(self) -> dict:
        """What produces this plan's grades, the run's sandbox and platform aside."""
        return provenance(self.points, self.settings_toml, self.weights_sha256, self.seed)

    def test_command(self, course: Path, output: Path) -> list[str]:
        g = self.grading
        # one student process each: the class's jobs already share the allocation out
        cmd = [sys.executable, "-m", "theinference", "test", "-C", str(course), "--jobs", "1"]
        cmd += ["--format", "json", "--output", str(output), "--weights", self.weights]
        for slug in self.points:
            cmd += ["--stage", slug]
        for name in self.cases:
            cmd += ["--case", name]
        # the seed travels in the environment (test_env), never on a command line others read
        for option, value in (("--timeout", g.timeout), ("--memory-gb", g.memory_gb),
                              ("--output-kb", g.output_kb), ("--sandbox", g.sandbox or "auto")):
            if value is not None:
                cmd += [option, str(value)]
        if g.speed != "off":
            cmd.append("--speed")
        return cmd

    def test_env(self) -> dict[str, str]:
        """The grader's environment for `theinference test`, with this plan's seed (or none)."""
        env = {k: v for k, v in os.environ.items() if k != "THEINFERENCE_SEED"}
        value = self.seed.value
        return env | ({SEED_VAR: str(value)} if value is not None else {})


def blas_threads(allocation: Allocation, jobs: int) -> int:
    """Each job's BLAS threads: the allocation's CPUs shared out among the jobs."""
    return max(1, allocation.cpus // max(1, jobs))


def job_share(allocation: Allocation, jobs: int) -> dict:
    """What one job had, for its record: its CPUs (as BLAS threads) and memory, the whole
    allocation's, and where those figures came from."""
    return {
        "jobs": jobs,  # graded at once
        "cpus": blas_threads(allocation, jobs),
        "memory_bytes": allocation.memory_bytes // max(1, jobs),
        "allocation_cpus": allocation.cpus,
        "allocation_memory_bytes": allocation.memory_bytes,
        "cpus_from": allocation.cpus_from,  # machine | affinity | cgroup quota | declared
        "memory_from": allocation.memory_from,  # machine | memory limit | declared
    }


def in_shard(sid: str, shard: tuple[int, int] | None) -> bool:
    """Shard I of N (1-based) by a hash of the id: the same slice on every machine, and a
    student's shard does not move when others join the class."""
    if shard is None:
        return True
    index, count = shard
    return int(hashlib.sha256(sid.encode()).hexdigest()[:12], 16) % count == index - 1


def grade_class(
    subs: list[Submission],
    plan: Plan,
    results_dir: Path,
    jobs: int,
    on_done: Callable[[Record, bool], None] = lambda record, reused: None,
    allocation: Allocation | None = None,
) -> list[Record]:
    """Grade every submission (reusing a record whose content and plan are unchanged), `jobs`
    at once within `allocation` (default: this process's)."""
    key = plan.key()
    allocation = allocation or read_allocation()

    def one(sub: Submission) -> Record:
        record, reused = grade_or_reuse(sub, plan, key, results_dir, jobs, allocation)
        on_done(record, reused)
        return record

    with ThreadPoolExecutor(max_workers=jobs) as pool:
        return list(pool.map(one, subs))


def grade_or_reuse(sub, plan, key, results_dir, jobs, allocation) -> tuple[Record, bool]:
    from theinference.classroom.records import write_record

    started = time.monotonic()
    try:
        files = read_files(sub)
    except IntakeError as exc:
        record = new_record(sub, plan, key, Ran("rejected", str(exc)), started)
        write_record(results_dir, record)
        return record, False
    digest = content_hash(files)
    old = read_record(record_path(results_dir, sub.id))
    if old and (old.content_sha256, old.plan_key) == (digest, key) and old.status in FINAL:
        return old, True
    status, message, results = run_test(files, plan, jobs, allocation)
    ran = Ran(status, message, results, files, job_share(allocation, jobs))
    record = new_record(sub, plan, key, ran, started)
    write_record(results_dir, record)
    return record, False


@dataclass(frozen=True)
class Ran:
    """What grading one submission came to, and what it ran with: its files, once read, and
    its job's share of the allocation (job_share), once a job ran."""

    status: str  # graded | rejected | grader-error
    message: str
    results: RunResult | None = None
    files: dict[str, bytes] | None = None
    share: dict | None = None


def new_record(sub, plan, key: str, ran: Ran, started: float) -> Record:
    results, files = ran.results, ran.files
    rows = stage_rows(results, plan.points, plan.grading)
    return Record(
        id=sub.id,
        source=sub.path.name,
        language=None if files is None else submission_language(files, plan.settings_toml).name,
        content_sha256="" if files is None else content_hash(files),
        plan_key=key,
        status=ran.status,
        message=ran.message,
        seconds=round(time.monotonic() - started, 3),
        score=round(sum(r.score for r in rows), 4),
        max_score=round(sum(r.max_score for r in rows), 4),
        rows=rows,
        provenance=with_run(plan.provenance(), results.sandbox if results else "not run"),
        code=own_code(files) if files else {},
        sandbox=results.sandbox if results else None,  # bwrap | unprivileged-user | none
        cpu_account=results.cpu_account if results else None,  # cgroup-v2 | ... (account.py)
        sandbox_notes=list(results.notes) if results else [],
        allocation=ran.share,  # job_share: what its job had; None when nothing ran
        results=results,
    )


def run_test(files: dict[str, bytes], plan: Plan, jobs: int,
             allocation: Allocation | None = None) -> tuple[str, str, RunResult | None]:
    """`theinference test` on a fresh course holding the student's files, in a throwaway
    folder, as one of `jobs` sharing `allocation` (default: this process's); returns (status,
    message, its run). Its results are read from that folder, outside the course the student's
    files are laid in (a results file among them is never the one read), and only once the
    grader exited as a run that graded does (0 or 1); results not as the grader writes them
    are the grader's error, with where they go wrong."""
    work = Path(tempfile.mkdtemp(prefix="theinference-grade-"))
    try:
        language = submission_language(files, plan.settings_toml)
        course = lay_over_template(files, work / "course", plan.settings_toml, language)
        language.runner.give(course, cache_dir())  # installed once for the class, then copied
        output, errors = work / "results.json", work / "stderr.txt"
        with errors.open("wb") as err:
            code = run_bounded(plan.test_command(course, output), err, plan.submission_timeout,
                               jobs, plan.test_env(), allocation)
        tail = errors.read_bytes()[-STDERR_KEPT:].decode(errors="replace").strip()
        if code in (0, 1) and output.is_file():
            return "graded", "", read_run(output.read_bytes())
        if code is None:
            return "grader-error", f"not finished within {plan.submission_timeout:g} s", None
        return "grader-error", f"theinference test exited {code}: {tail}", None
    except RunnerError as exc:
        return "grader-error", str(exc), None
    except ResultsError as exc:
        return "grader-error", f"unreadable results: {exc}", None
    except (OSError, ValueError) as exc:
        return "grader-error", f"{type(exc).__name__}: {exc}", None
    finally:
        remove_tree(work)


def run_bounded(cmd: list[str], stderr, timeout: float, jobs: int, env: dict,
                allocation: Allocation | None = None) -> int | None:
    """Run the grader with its share of the allocation's CPUs as BLAS threads; past the
    backstop, interrupt it (it stops its student process on the way out), then kill its group.
    None: it had to be stopped."""
    env = dict(env)
    threads = str(blas_threads(allocation or read_allocation(), jobs))
    env.update(OMP_NUM_THREADS=threads, OPENBLAS_NUM_THREADS=threads, MKL_NUM_THREADS=threads)
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=stderr, env=env, start_new_session=True)
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        _signal_group(proc.pid, signal.SIGINT)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            _signal_group(proc.pid, signal.SIGKILL)
            proc.wait()
        return None


def _signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:
        pass
