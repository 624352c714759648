"""A graded submission's record, as plain values: a Record, with a StageRow per planned stage
and the run it came to (a RunResult), and the record's file (RESULTS/submissions/ID.json,
classroom/records.py) written and read back field for field. The run inside is written and
read by json_form.py, as `theinference test --format json` writes it.

A record file is read as untrusted, as a run's results are (reading.py): a damaged, foreign
or forged one is a ResultsError that says where."""

from dataclasses import asdict, dataclass, field

from theinference.results import RunResult
from theinference.results.json_form import from_json, to_json
from theinference.results.reading import (
    NUMBER,
    OBJECT,
    TEXT,
    WHOLE,
    Fields,
    ResultsError,
    list_of,
    mapping_of,
    or_null,
)

SCHEMA = "theinference.submission/1"
NOT_GRADED = "not graded"  # the status of a planned stage the run did not reach


@dataclass(frozen=True)
class StageRow:
    """A stage's line in the gradebook: its status (a Status's value, or NOT_GRADED), score,
    suspected bug, worst error in tolerances, and cases passed of those run."""

    slug: str
    status: str
    score: float
    max_score: float
    suspected_bug: str | None = None
    worst_tolerance_multiple: float | None = None
    cases_passed: int = 0
    cases_total: int = 0


@dataclass
class Record:
    """A graded (or refused) submission, as its file holds it."""

    id: str  # the student: a file name, never trusted as text
    status: str  # graded | rejected | grader-error (| missing: a merge's row no shard graded)
    message: str = ""
    score: float = 0.0
    max_score: float = 0.0
    rows: list[StageRow] = field(default_factory=list)  # each planned stage, in course order
    source: str = ""  # the submission's entry in the submissions folder
    language: str | None = None  # python | ts; None when the submission could not be read
    content_sha256: str = ""
    plan_key: str = ""
    seconds: float = 0.0
    provenance: dict = field(default_factory=dict)  # grading/provenance.py, with the run's
    code: dict[str, str] = field(default_factory=dict)  # the student's own, for similarity
    sandbox: str | None = None  # bwrap | unprivileged-user | none; None when nothing ran
    cpu_account: str | None = None  # cgroup-v2 | ... (student/account.py)
    sandbox_notes: list[str] = field(default_factory=list)
    allocation: dict | None = None  # batch.job_share: what its job had; None when nothing ran
    results: RunResult | None = None  # the run; None when the grader could not finish it


def record_json(record: Record) -> dict:
    """The record's file, field for field as it has always been written."""
    return {
        "schema": SCHEMA,
        "id": record.id,
        "source": record.source,
        "language": record.language,
        "content_sha256": record.content_sha256,
        "plan_key": record.plan_key,
        "status": record.status,
        "message": record.message,
        "seconds": record.seconds,
        "score": record.score,
        "max_score": record.max_score,
        "stages": [asdict(row) for row in record.rows],
        "provenance": record.provenance,
        "code": record.code,
        "sandbox": record.sandbox,
        "cpu_account": record.cpu_account,
        "sandbox_notes": record.sandbox_notes,
        "allocation": record.allocation,
        "results": None if record.results is None else to_json(record.results),
    }


def record_from_json(data: object) -> Record:
    """The Record a file holds; ResultsError when it is not one this grader wrote."""
    fields = Fields(data, "record")
    if fields.get("schema", TEXT) != SCHEMA:
        raise ResultsError(f"record: schema is not {SCHEMA}")
    results = fields.get("results", or_null(OBJECT), None)
    return Record(
        id=fields.get("id", TEXT),
        status=fields.get("status", TEXT),
        message=fields.get("message", TEXT),
        score=fields.get("score", NUMBER),
        max_score=fields.get("max_score", NUMBER),
        rows=[row_from(row) for row in fields.objects("stages")],
        source=fields.get("source", TEXT, ""),
        language=fields.get("language", or_null(TEXT), None),
        content_sha256=fields.get("content_sha256", TEXT),
        plan_key=fields.get("plan_key", TEXT),
        seconds=fields.get("seconds", NUMBER, 0.0),
        provenance=fields.get("provenance", OBJECT, {}),
        code=fields.get("code", mapping_of(TEXT), {}),
        sandbox=fields.get("sandbox", or_null(TEXT), None),
        cpu_account=fields.get("cpu_account", or_null(TEXT), None),
        sandbox_notes=list(fields.get("sandbox_notes", list_of(TEXT), [])),
        allocation=fields.get("allocation", or_null(OBJECT), None),
        results=None if results is None else from_json(results),
    )


def row_from(row: Fields) -> StageRow:
    return StageRow(
        slug=row.get("slug", TEXT),
        status=row.get("status", TEXT),
        score=row.get("score", NUMBER),
        max_score=row.get("max_score", NUMBER),
        # absent from a row: nothing was found, compared or run (as StageRow's defaults)
        suspected_bug=row.get("suspected_bug", or_null(TEXT), None),
        worst_tolerance_multiple=row.get("worst_tolerance_multiple", or_null(NUMBER), None),
        cases_passed=row.get("cases_passed", WHOLE, 0),
        cases_total=row.get("cases_total", WHOLE, 0),
    )
