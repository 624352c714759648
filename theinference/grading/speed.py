"""The speed figure instructors rank by: a submission's cached generation, in CPU seconds read
by the grader from outside its process (student/cpu.py), against the oracle's own cached
generation measured the same way: run as a course of its own (the yardstick), in the same
sandbox, under the same limits, in the same job, its calls interleaved with the student's.
A loaded machine slows both alike, so the ratio holds where seconds do not.

Two workloads, each the best of several repeats: a generation (32 tokens after a 16-token
prompt: tokens per CPU second, prefill included) and decode steps at a long context (the
step after a 512-token prompt: (generate 33 - generate 1) / 32). Both processes run BLAS on
one thread: CPU time then counts the work done, not threads spinning while they wait for a
core. Only a submission whose generate loop passed is timed; any other shows its status.

Every timed call gets a prompt drawn afresh for this job (no two share a prefix), and its
tokens must be the oracle's for the same prompt: an answer looked up (precomputed, or kept
from an earlier call) or made up fast earns no figure.
"""

import secrets
import shutil
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path

from theinference.course import languages
from theinference.course.directory import init_course
from theinference.curriculum.stages import token_ids
from theinference.oracle import gpt2 as oracle_gpt2
from theinference.oracle.weights import Weights
from theinference.student.process import StudentProcess
from theinference.student.sandbox import ONE_BLAS_THREAD
from theinference.student.setup import ProcessSetup

SCHEMA = "theinference.speed/1"
STAGE = "generate-loop"  # the stage whose pass makes a speed figure meaningful
SHORT_PROMPT, GENERATED = 16, 32
LONG_PROMPT, DECODE_STEPS = 512, 32
WARM_UP = [[464, 2068], 2]  # imports and the weights' pages, before anything is timed
CALLS = {"generate": (SHORT_PROMPT, GENERATED), "long_one": (LONG_PROMPT, 1),
         "long_many": (LONG_PROMPT, 1 + DECODE_STEPS)}  # name -> (prompt length, new tokens)
REPEATS = 3
ONE_THREAD = {**ONE_BLAS_THREAD, "OMP_NUM_THREADS": "1"}  # both sides, whatever the machine

YARDSTICK_ADAPTERS = '''"""The oracle's own cached generation, run as a student's course is run."""

from src.gpt2 import load_weights, n_layer
from theinference.oracle import gpt2 as oracle


def run_generate(prompt_ids, max_new_tokens):
    w = load_weights()
    layers = n_layer(w)
    prefilled = oracle.forward(prompt_ids, w, layers, last_only=True)
    return oracle.greedy(prefilled, max_new_tokens, w, layers)
'''


class SpeedError(Exception):
    """A timed call that did not return; the message says which and how."""

    def __init__(self, status: str, message: str):
        super().__init__(message)
        self.status = status


@dataclass
class Workloads:
    """One process's best (least) CPU seconds for each timed call."""

    generate: float = float("inf")  # GENERATED tokens after SHORT_PROMPT
    long_one: float = float("inf")  # one token after LONG_PROMPT: the prefill, mostly
    long_many: float = float("inf")  # 1 + DECODE_STEPS tokens after LONG_PROMPT

    def decode_seconds(self) -> float:
        # per decode step at the long context; never negative (noise can invert two runs)
        return max(self.long_many - self.long_one, 0.0) / DECODE_STEPS

    def tokens_per_second(self) -> float:
        return GENERATED / self.generate if self.generate > 0 else 0.0


def not_measured(status: str, reason: str) -> dict:
    """A speed entry that is a status, never a figure."""
    return {"schema": SCHEMA, "status": status, "reason": reason}


def speed_of(setup: ProcessSetup, weights: Weights, repeats: int = REPEATS) -> dict:
    """Time the student's cached generation against the oracle's; the JSON's `speed`. The
    oracle's side runs in a process started exactly as the student's (`setup`), on the
    yardstick course."""
    limits = replace(setup.limits, timeout=max(setup.limits.timeout, 120.0))
    student = replace(setup, limits=limits, env=ONE_THREAD)
    yardstick = replace(student, course_dir=yardstick_course(), language=languages.DEFAULT)
    yard = yardstick.course_dir
    try:
        with (
            StudentProcess(student) as you,
            StudentProcess(yardstick) as oracle,  # init_course's
        ):
            yours, theirs = timed_pair(you, oracle, weights.config, repeats)
            kind = you.sandbox
    except SpeedError as exc:
        return not_measured(exc.status, str(exc))
    finally:
        shutil.rmtree(yard.parent, ignore_errors=True)
    return figures(yours, theirs, repeats, kind)


def timed_pair(you, oracle, config, repeats: int) -> tuple[Workloads, Workloads]:
    """A small call each, untimed (imports, the weights' pages), then `repeats` rounds in
    which the oracle and the student take turns, call by call, on the same fresh prompt:
    whatever loads the machine meanwhile falls on both."""
    yours, theirs = Workloads(), Workloads()
    timed(oracle, WARM_UP, "the oracle's yardstick")
    timed(you, WARM_UP, "your run_generate")
    for _ in range(repeats):
        for name, (length, count) in CALLS.items():
            args = [token_ids({"random": length, "seed": secrets.randbits(31)}, config), count]
            their_cpu, expected = timed(oracle, args, "the oracle's yardstick")
            your_cpu, tokens = timed(you, args, "your run_generate")
            if tokens != expected:
                raise SpeedError("unverified", f"your run_generate({length}-token prompt, "
                                 f"{count}) returned other tokens than the oracle's greedy "
                                 "ones for the same prompt: no figure without the right answer")
            setattr(theirs, name, min(getattr(theirs, name), their_cpu))
            setattr(yours, name, min(getattr(yours, name), your_cpu))
    return yours, theirs


def timed(process: StudentProcess, args: list, who: str) -> tuple[float, list[int] | None]:
    """CPU seconds of one run_generate call, read from outside the process, and the token
    ids it returned (None: not a list of ids)."""
    outcome = process.call("run_generate", args)
    if outcome.kind != "returned":
        status = "timeout" if outcome.kind == "timeout" else "error"
        raise SpeedError(status, f"{who}({len(args[0])}-token prompt, {args[1]}): "
                                 f"{outcome.kind}: {outcome.message}")
    if outcome.cpu_seconds is None:
        raise SpeedError("error", f"{who}: no CPU time could be read")
    try:
        tokens = [int(t) for t in outcome.value]
    except (TypeError, ValueError, OverflowError):
        tokens = None
    return outcome.cpu_seconds, tokens


def figures(yours: Workloads, theirs: Workloads, repeats: int, sandbox: str) -> dict:
    """The JSON's speed entry: the student's figures, the oracle's, and their ratios (above 1:
    faster than the oracle)."""
    mine, oracle = yours.decode_seconds(), theirs.decode_seconds()
    return {
        "schema": SCHEMA,
        "status": "measured",
        "ratio": round(oracle / mine, 4) if mine > 0 else None,
        "tokens_ratio": round(yours.tokens_per_second() / theirs.tokens_per_second(), 4),
        "tokens_per_cpu_second": round(yours.tokens_per_second(), 3),
        "decode_ms": round(1000 * mine, 3),
        "oracle_tokens_per_cpu_second": round(theirs.tokens_per_second(), 3),
        "oracle_decode_ms": round(1000 * oracle, 3),
        "workload": {"generate": [SHORT_PROMPT, GENERATED],
                     "decode": [LONG_PROMPT, DECODE_STEPS]},
        "repeats": repeats,
        "sandbox": sandbox,
    }


def yardstick_course() -> Path:
    """A course whose run_generate is the oracle's cached greedy decode: the template's
    load_weights, and a copy of the oracle's own modules (the sandbox hides the grader's)."""
    root = Path(tempfile.mkdtemp(prefix="theinference-yardstick-"))
    root.chmod(0o755)  # readable by the unprivileged user a sandbox may run it as
    course = root / "course"
    init_course(course)
    package = course / "theinference" / "oracle"
    package.mkdir(parents=True)
    (course / "theinference" / "__init__.py").write_text("")
    (package / "__init__.py").write_text("")
    source = Path(oracle_gpt2.__file__).parent
    for name in ("gpt2.py", "config.py"):
        shutil.copyfile(source / name, package / name)
    (course / "tests" / "adapters.py").write_text(YARDSTICK_ADAPTERS)
    return course


def speed_after(result, stages, setup: ProcessSetup, weights: Weights) -> dict:
    """The run's speed entry: a figure when the generate loop passed in full in this run,
    else that stage's status and why there is no figure."""
    from theinference.grading.prerequisites import stage_limits
    from theinference.results import Status

    done = next((s for s in result.stages if s.slug == STAGE), None)
    if done is None:
        return not_measured("not graded", f"{STAGE} was not graded in this run")
    if done.status != Status.PASSED or done.partial:
        status = "partial" if done.partial else done.status.value
        why = "ran only some of its cases" if done.partial else f"is {status}"
        return not_measured(status, f"{STAGE} {why}: no speed without a pass")
    stage = next(s for s in stages if s.slug == STAGE)
    return speed_of(replace(setup, limits=stage_limits(stage, setup.limits)), weights)
