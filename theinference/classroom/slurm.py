"""The Slurm script of `theinference workflow slurm`: `bash FILE` on a login node submits an
array job (task I grades shard I/N from SLURM_ARRAY_TASK_ID into results-I/) and a merge job
that runs once every task has ended, however it ended (--dependency=afterany): a failed task
never leaves the merge pending. The merge takes the students of the submissions folder as it is
then, so a student whose task failed gets a "missing" row and the merge fails; submitting
again cancels what is left of the last submission (its job ids are kept in LOGS/jobs) and
grades only what is missing.

Every task first checks that its node reaches the install (the absolute path of the Python this
script was generated with: an `SBATCH_EXPORT=NONE` PATH would not hold a venv), the course and
the submissions, and exits with a code of its own and one line otherwise."""

import shlex

from theinference.classroom.clusters import ClassJob

# a task's exit when its node does not reach what it needs (docs/instructors.md lists them)
NO_INSTALL, NO_COURSE, NO_SUBMISSIONS, NO_RESULTS = 10, 11, 12, 13

SLURM = """#!/usr/bin/env bash
# Grade a class on Slurm in {shards} array tasks, then merge (`theinference workflow slurm`).
# Run from the folder holding {submissions}/ (one folder or archive per student) and {course}/
# (with the course's theinference.toml), on a login node; the compute nodes must see this
# folder and the install below at the same paths:
#
#     bash {name}
#
# It submits the array (task I grades shard I/{shards} into results-I/) and a merge job that
# runs once every task has ended, however it ended: it joins the students of {submissions}/
# as they are then into {results}/ (gradebook.csv, one JSON per student, class.html); a
# student no task graded gets a "missing" row and the merge fails. Submit again (the same
# command): it cancels the last submission's jobs still queued or running, and only what is
# missing is graded. Logs: {logs}/JOBNAME_JOB_TASK.out; the last job ids: {logs}/jobs.
# Each task grades as many submissions at once as its CPUs and memory allow (passed to the
# grader as --cpus and --memory), each needing the student's 8 GiB cap and 1.5 GiB for the
# grader: as written, one at a time. For N at once ask for --cpus-per-task=N and --mem=(N*10)G.
#SBATCH --job-name=theinference-grade
#SBATCH --cpus-per-task=1
#SBATCH --mem=10G
#SBATCH --time={time}
{directives}#SBATCH --output={logs}/%x_%A_%a.out
set -euo pipefail
# the install this script was generated with: the same path on every node
PYTHON={python}
SHARDS={shards}
SUBMISSIONS={submissions}
COURSE={course}
RESULTS={results}
LOGS={logs}
GRADE_OPTIONS=({grade_options})

reachable() {{  # this node reaches the install, the course and the submissions, or one line
  "$PYTHON" -c 'import theinference' 2>/dev/null || {{
    echo "theinference: $PYTHON cannot run theinference on $(hostname)" \\
      "(install it at that path on every node, or generate the script with --python)" >&2
    exit {no_install}; }}
  [ -r "$COURSE/theinference.toml" ] || {{
    echo "theinference: $COURSE/theinference.toml (from $PWD) is not readable on $(hostname)" >&2
    exit {no_course}; }}
  [ -d "$SUBMISSIONS" ] && [ -r "$SUBMISSIONS" ] && [ -x "$SUBMISSIONS" ] || {{
    echo "theinference: $SUBMISSIONS/ (from $PWD) is not readable on $(hostname)" >&2
    exit {no_submissions}; }}
}}

cancel_previous() {{  # the last submission's jobs still queued or running are superseded
  [ -f "$LOGS/jobs" ] || return 0
  local array merge id
  read -r array merge < "$LOGS/jobs"
  for id in $merge $array; do  # the merge first: the array's end would start it
    if squeue -h -j "$id" 2>/dev/null | grep -q .; then
      scancel "$id" && echo "cancelled job $id of the last submission"
    fi
  done
}}

submit() {{
  reachable
  mkdir -p "$LOGS"
  cancel_previous
  local array merge
  array=$(sbatch --parsable --array=1-$SHARDS "$0" shard)
  array=${{array%%;*}}
  echo "$array" > "$LOGS/jobs"  # kept at once: a merge sbatch refuses leaves it to cancel
  merge=$(sbatch --parsable --dependency=afterany:$array --job-name=theinference-merge \\
    --output="$LOGS/%x_%j.out" "$0" merge)
  merge=${{merge%%;*}}
  echo "$array $merge" > "$LOGS/jobs"
  echo "grading: array job $array (tasks ${{array}}_1 to ${{array}}_$SHARDS)"
  echo "merge:   job $merge, once every task has ended"
  echo "follow:  squeue -j $array,$merge    afterwards: sacct -j $array,$merge"
  echo "logs:    $LOGS/theinference-grade_${{array}}_TASK.out, $LOGS/theinference-merge_$merge.out"
}}

shard() {{
  local I=${{SLURM_ARRAY_TASK_ID:?this step runs as a task of the array job}}
  reachable
  # the task's allocation: its CPUs, and its memory in MB (per node, or per CPU)
  local CPUS=${{SLURM_CPUS_PER_TASK:-1}}
  local MEM_MB=${{SLURM_MEM_PER_NODE:-$(( ${{SLURM_MEM_PER_CPU:-0}} * CPUS ))}}
  local ALLOCATION=(--cpus "$CPUS")
  if [ "$MEM_MB" -gt 0 ]; then ALLOCATION+=(--memory "${{MEM_MB}}M"); fi
  echo "task $I of $SHARDS on $(hostname): $SUBMISSIONS/ shard $I/$SHARDS into results-$I/"
  "$PYTHON" -m theinference grade "$SUBMISSIONS" --out "results-$I" --course-dir "$COURSE" \\
    --shard "$I/$SHARDS" "${{ALLOCATION[@]}}" ${{GRADE_OPTIONS[@]+"${{GRADE_OPTIONS[@]}}"}}
}}

merge() {{
  reachable
  local shards=() I status=0
  for I in $(seq 1 $SHARDS); do
    if [ -d "results-$I/submissions" ]; then shards+=("results-$I"); else
      echo "task $I left no results (its log: $LOGS/theinference-grade_*_$I.out)" >&2; fi
  done
  [ ${{#shards[@]}} -gt 0 ] || {{
    echo "no task left results: nothing to merge" >&2; exit {no_results}; }}
  "$PYTHON" -m theinference gradebook merge "${{shards[@]}}" --out "$RESULTS" \\
    --submissions "$SUBMISSIONS" || status=$?
  if [ $status -le 1 ]; then  # merged, perhaps with missing students: report what there is
    "$PYTHON" -m theinference report "$RESULTS" --html "$RESULTS/class.html" || status=$?
  fi
  exit $status
}}

case "${{1:-submit}}" in
  submit|shard|merge) "${{1:-submit}}" ;;
  *) echo "usage: bash $0 [submit|shard|merge]" >&2; exit 2 ;;
esac
"""


def slurm_script(job: ClassJob, name: str) -> str:
    directives = "".join(f"#SBATCH --{key}={value}\n"
                         for key, value in (("account", job.account),
                                            ("partition", job.partition)) if value)
    return SLURM.format(
        shards=job.shards, name=name, time=job.time, directives=directives,
        python=shlex.quote(job.python), submissions=shlex.quote(job.submissions),
        course=shlex.quote(job.course), results=shlex.quote(job.results), logs=job.logs,
        grade_options=job.grade_options(), no_install=NO_INSTALL, no_course=NO_COURSE,
        no_submissions=NO_SUBMISSIONS, no_results=NO_RESULTS,
    )
