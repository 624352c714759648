"""What a student's process needs, as one value: the course and its language, the weights file,
the limits, the sandbox, the cancel event, what it runs (the adapters, or the grader's own
calibration) and where the machine's rate measured for it is kept. A run builds it once
(grading/session.py); every process of the run, and every sibling of one, is started from it."""

import threading
from dataclasses import dataclass, field
from pathlib import Path

from theinference.course.languages import Language
from theinference.student.sandbox import Sandbox


@dataclass(frozen=True)
class Limits:
    timeout: float = 60.0  # seconds per adapter call
    memory_bytes: int = 8 << 30  # heap and anonymous memory of the student's process
    output_bytes: int = 64 << 10  # captured stdout and stderr kept per call, each


@dataclass(frozen=True)
class ProcessSetup:
    course_dir: Path
    weights_path: Path
    limits: Limits = field(default_factory=Limits)
    cancel: threading.Event = field(default_factory=threading.Event, compare=False)
    sandbox: Sandbox | None = None  # None: the grader's own user (sandbox.choose decides)
    env: dict[str, str] = field(default_factory=dict)  # for its environment (BLAS threads)
    mode: str = "adapters"  # adapters | calibrate (the grader's own code only: calibration.py)
    language: Language | None = None  # an opened course's; None: the course directory says
    # where the rate measured for its course is kept across runs (calibration.RateMemo): a
    # signed memo in the grader's cache; None: in this grader's memory only
    rates: object = field(default=None, compare=False)
