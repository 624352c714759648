"""Grading a class past one machine, on the engines instructors have beside GitHub Actions
(workflow.py): a Slurm array job and a Kubernetes Indexed Job. Each shard runs
`grade --shard I/N` from its array or completion index into results-I/, then one step runs
`gradebook merge` and the class report. Paths are relative to the folder holding the
submissions and the course, so the same files run anywhere that folder is shared.

Each shard passes its allocation to the grader, which sizes its jobs and BLAS threads to it
(grading/allocation.py reads the affinity and cgroup besides): a Slurm task its
SLURM_CPUS_PER_TASK and SLURM_MEM_PER_NODE (or SLURM_MEM_PER_CPU times its CPUs) as --cpus
and --memory, a pod its requests through the downward API as THEINFERENCE_CPUS and
THEINFERENCE_MEMORY (a pod without a CPU limit sees the whole node otherwise)."""

import shlex

from theinference import __version__

SLURM = """#!/usr/bin/env bash
# Grade a class on Slurm in {shards} array tasks, then merge (`theinference workflow slurm`).
# Run from the folder holding {submissions}/ (one folder or archive per student) and {course}/
# (with the course's theinference.toml), on a login node where theinference is installed:
#
#     bash {name}
#
# It submits the array (task I grades shard I/{shards} into results-I/) and a merge job that
# starts when every task has succeeded; the results land in class-results/ (gradebook.csv, one
# JSON per student, class.html). A task fails when a submission could not be graded; submit
# again and only what is missing is graded. Each task grades as many submissions at once as
# its CPUs and memory allow (passed to the grader as --cpus and --memory), each needing the
# student's 8 GiB cap and 1.5 GiB for the grader: as written, one at a time. For N at once ask
# for --cpus-per-task=N and --mem=(N * 10)G.
#SBATCH --job-name=theinference-grade
#SBATCH --cpus-per-task=1
#SBATCH --mem=10G
#SBATCH --time=12:00:00
#SBATCH --output=theinference-%x-%A_%a.out
set -euo pipefail
SHARDS={shards}
case "${{1:-submit}}" in
  submit)
    command -v theinference >/dev/null || {{
      echo "theinference is not on PATH: pip install theinference=={version}" >&2; exit 3; }}
    array=$(sbatch --parsable --array=1-$SHARDS "$0" shard)
    sbatch --parsable --dependency=afterok:${{array%%;*}} --job-name=theinference-merge \\
      "$0" merge
    ;;
  shard)
    I=${{SLURM_ARRAY_TASK_ID:?this step runs as a task of the array job}}
    # the task's allocation: its CPUs, and its memory in MB (per node, or per CPU)
    CPUS=${{SLURM_CPUS_PER_TASK:-1}}
    MEM_MB=${{SLURM_MEM_PER_NODE:-$(( ${{SLURM_MEM_PER_CPU:-0}} * CPUS ))}}
    ALLOCATION=(--cpus "$CPUS")
    if [ "$MEM_MB" -gt 0 ]; then ALLOCATION+=(--memory "${{MEM_MB}}M"); fi
    theinference grade {submissions} --out results-$I --course-dir {course} --shard $I/$SHARDS \\
      "${{ALLOCATION[@]}}"
    ;;
  merge)
    theinference gradebook merge $(seq -f 'results-%g' 1 $SHARDS) --out class-results
    theinference report class-results --html class-results/class.html
    ;;
  *)
    echo "usage: bash $0 [submit|shard|merge]" >&2; exit 2
    ;;
esac
"""

GRADE_SCRIPT = """set -eu
command -v theinference >/dev/null || pip install --quiet theinference=={version}
I=$((JOB_COMPLETION_INDEX + 1))
theinference grade {submissions} --out results-$I --course-dir {course} --shard $I/{shards}
"""

MERGE_SCRIPT = """set -eu
command -v theinference >/dev/null || pip install --quiet theinference=={version}
theinference gradebook merge $(seq -f 'results-%g' 1 {shards}) --out class-results
theinference report class-results --html class-results/class.html
"""

KUBERNETES = """# Grade a class on Kubernetes in {shards} shards, then merge
# (`theinference workflow kubernetes`).
# {submissions}/ (one folder or archive per student) and {course}/ (with the course's
# theinference.toml) live on the volume claim {claim} (ReadWriteMany), which every pod mounts
# at /work. The Indexed Job's pod with completion index K grades shard K+1 of {shards} into
# results-(K+1)/; the merge Job joins them into class-results/ with class.html:
#
#     kubectl apply -f {name} -l step=grade
#     kubectl wait --for=condition=complete job/theinference-grade --timeout=24h
#     kubectl apply -f {name} -l step=merge
#
# Pods rarely may create user namespaces, so the grader runs each student's code as an
# unprivileged user rather than in bubblewrap (the report says which). Each pod's requests
# reach the grader (THEINFERENCE_CPUS, THEINFERENCE_MEMORY, by the downward API), and any
# limits through its cgroup: it grades as many submissions at once as they allow, each
# needing the student's 8 GiB cap and 1.5 GiB for the grader (as written, one at a time).
apiVersion: batch/v1
kind: Job
metadata:
  name: theinference-grade
  labels: {{step: grade}}
spec:
  completionMode: Indexed
  completions: {shards}
  parallelism: {shards}
  backoffLimit: {shards}
  template:
    spec:
      restartPolicy: Never
      containers:
        - name: grade
          image: {image}
          workingDir: /work
          command: ["sh", "-c"]
          args:
            - |
{grade_script}
          resources:
            requests: {{cpu: "1", memory: 10Gi}}
          env:
            - name: THEINFERENCE_CPUS
              valueFrom: {{resourceFieldRef: {{resource: requests.cpu}}}}
            - name: THEINFERENCE_MEMORY
              valueFrom: {{resourceFieldRef: {{resource: requests.memory}}}}
          volumeMounts: [{{name: class, mountPath: /work}}]
      volumes: [{{name: class, persistentVolumeClaim: {{claimName: {claim}}}}}]
---
apiVersion: batch/v1
kind: Job
metadata:
  name: theinference-merge
  labels: {{step: merge}}
spec:
  backoffLimit: 1
  template:
    spec:
      restartPolicy: Never
      containers:
        - name: merge
          image: {image}
          workingDir: /work
          command: ["sh", "-c"]
          args:
            - |
{merge_script}
          volumeMounts: [{{name: class, mountPath: /work}}]
      volumes: [{{name: class, persistentVolumeClaim: {{claimName: {claim}}}}}]
"""


def slurm_script(shards: int, submissions: str, course: str, name: str) -> str:
    return SLURM.format(shards=shards, submissions=shlex.quote(submissions),
                        course=shlex.quote(course), name=name, version=__version__)


def kubernetes_jobs(shards: int, submissions: str, course: str, name: str, claim: str,
                    image: str) -> str:
    fields = dict(shards=shards, submissions=shlex.quote(submissions),
                  course=shlex.quote(course), version=__version__)
    return KUBERNETES.format(
        **fields, name=name, claim=claim, image=image,
        grade_script=_indent(GRADE_SCRIPT.format(**fields)),
        merge_script=_indent(MERGE_SCRIPT.format(**fields)),
    )


def _indent(script: str, by: int = 14) -> str:
    return "".join(" " * by + line + "\n" for line in script.splitlines()).rstrip("\n")
