"""What a grading run tells its listeners while it goes: stages and cases starting and
finishing. The run itself never prints; the terminal report, watch mode, `verify` and `bench`
listen and draw. Events carry results, never rendering."""

import threading
from collections.abc import Callable
from dataclasses import dataclass

from theinference.results import CaseResult, RunResult, StageResult


@dataclass(frozen=True)
class RunStarted:
    stages: tuple[str, ...]  # slugs, in the order they will run


@dataclass(frozen=True)
class StageStarted:
    slug: str
    title: str
    cases: int  # how many cases it will run at most


@dataclass(frozen=True)
class CaseStarted:
    stage: str
    case: str
    index: int  # 0-based, in running order
    total: int


@dataclass(frozen=True)
class CaseFinished:
    stage: str
    result: CaseResult


@dataclass(frozen=True)
class StageFinished:
    result: StageResult


@dataclass(frozen=True)
class RunFinished:
    result: RunResult


Event = RunStarted | StageStarted | CaseStarted | CaseFinished | StageFinished | RunFinished
Listener = Callable[[Event], None]


def ignore(_event: Event) -> None:
    """The listener of a run nobody watches."""


def serialized(listener: Listener) -> Listener:
    """The listener told one event at a time, whichever thread tells it."""
    lock = threading.Lock()

    def told(event) -> None:
        with lock:
            listener(event)

    return told
