"""GitHub Actions workflows: a matrix that grades a class in shards and merges them (the worked
example of `grade --shard`), and a student repository's workflow that grades on push and
writes the stage table to the job summary."""

from theinference import __version__
from theinference.results import RunResult, Status

MATRIX = """# Grade a class in {shards} parallel jobs, then merge (`theinference workflow matrix`).
# Put the submissions in {submissions}/ (one folder or archive per student) and the course's
# theinference.toml in {course}/. Results: the "class-results" artifact (gradebook.csv,
# one JSON per student, class.html).
name: grade-class
on: workflow_dispatch
jobs:
  grade:
    runs-on: ubuntu-latest
    strategy:
      fail-fast: false
      matrix:
        shard: [{shard_list}]
    steps:
      - uses: actions/checkout@v4
      - uses: actions/setup-python@v5
        with:
          python-version: "3.11"
      - uses: actions/cache@v4
        with:
          path: ~/.cache/theinference
          key: theinference-{version}
      - run: sudo apt-get install -y bubblewrap
      - run: pip install theinference=={version}
      - run: >-
          theinference grade {submissions} --out results-${{{{ matrix.shard }}}}
          --course-dir {course} --shard ${{{{ matrix.shard }}}}/{shards}
      - uses: actions/upload-artifact@v4
        with:
          name: shard-${{{{ matrix.shard }}}}
          path: results-${{{{ matrix.shard }}}}
  merge:
    needs: grade
    runs-on: ubuntu-latest
    steps:
      - uses: actions/setup-python@v5
        with:
          python-version: "3.11"
      - run: pip install theinference=={version}
      - uses: actions/download-artifact@v4
        with:
          pattern: shard-*
      - run: theinference gradebook merge shard-* --out class-results
      - run: theinference report class-results --html class-results/class.html
      - uses: actions/upload-artifact@v4
        with:
          name: class-results
          path: class-results
"""

STUDENT = """# Grades every push with theinference and shows the stage table in the job summary.
name: grade
on: [push, workflow_dispatch]
jobs:
  grade:
    runs-on: ubuntu-latest
    steps:
      - uses: actions/checkout@v4
      - uses: actions/setup-python@v5
        with:
          python-version: "3.11"
      - uses: actions/cache@v4
        with:
          path: ~/.cache/theinference
          key: theinference-{version}
      - run: pip install theinference=={version}
      - name: theinference test
        run: theinference test --json results.json --junit results.xml
      - name: Stage table
        if: always()
        run: theinference summary results.json >> "$GITHUB_STEP_SUMMARY"
      - uses: actions/upload-artifact@v4
        if: always()
        with:
          name: theinference-results
          path: results.*
"""

STUDENT_WORKFLOW_PATH = ".github/workflows/theinference.yml"


def matrix_workflow(shards: int, submissions: str, course: str) -> str:
    return MATRIX.format(shards=shards, shard_list=", ".join(str(i) for i in range(1, shards + 1)),
                         submissions=submissions, course=course, version=__version__)


def student_workflow() -> str:
    return STUDENT.format(version=__version__)


def stage_table_markdown(run: RunResult) -> str:
    """The job summary: one row per stage of a `theinference test --json` file."""
    from theinference.grading.scores import suspected_bug_of

    lines = ["| stage | status | cases passed | suspected bug |", "|---|---|---|---|"]
    for stage in run.stages:
        passed = sum(c.status == Status.PASSED for c in stage.cases)
        bug = suspected_bug_of(stage) or ""
        lines.append(f"| {stage.slug} | {stage.status} | {passed}/{len(stage.cases)} | {bug} |")
    verdict = "all stages passed" if run.passed else "not all stages passed yet"
    return f"### theinference: {verdict}\n\n" + "\n".join(lines) + "\n"
