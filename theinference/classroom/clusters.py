"""Grading a class past one machine, on the engines instructors have beside GitHub Actions
(workflow.py): a Slurm array job (slurm.py) and a Kubernetes Indexed Job (here). Each shard
runs `grade --shard I/N` from its array or completion index into results-I/, then one step runs
`gradebook merge` of the students in the submissions folder and the class report, once every
shard has ended however it ended. Paths are relative to the folder holding the submissions and
the course, so the same files run anywhere that folder is shared.

Each shard passes its allocation to the grader, which sizes its jobs and BLAS threads to it
(grading/allocation.py reads the affinity and cgroup besides): a Slurm task its
SLURM_CPUS_PER_TASK and SLURM_MEM_PER_NODE (or SLURM_MEM_PER_CPU times its CPUs) as --cpus
and --memory, a pod its requests through the downward API as THEINFERENCE_CPUS and
THEINFERENCE_MEMORY (a pod without a CPU limit sees the whole node otherwise)."""

import re
import shlex
import sys
from dataclasses import dataclass, field

from theinference import __version__

# what may stand unquoted in a #SBATCH line or a bash assignment
PLAIN = re.compile(r"[A-Za-z0-9_./+,:@-]+")
SLURM_TIME = re.compile(r"(\d+-)?\d+(:\d+){0,2}")  # MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM:SS


class JobError(ValueError):
    """An option the generated files could not carry; the message says which and why."""


@dataclass(frozen=True)
class ClassJob:
    """What every task of a cluster's grading run is told: the class, and `grade`'s options."""

    shards: int
    submissions: str = "submissions"
    course: str = "course"
    results: str = "class-results"
    stages: tuple[str, ...] = ()
    seed: int | None = None
    time: str = "12:00:00"
    account: str | None = None
    partition: str | None = None
    logs: str = "logs"
    python: str = field(default_factory=lambda: sys.executable)

    def __post_init__(self):
        if self.shards < 1:
            raise JobError("--shards must be at least 1")
        if not SLURM_TIME.fullmatch(self.time):
            raise JobError(f"--time takes Slurm's MM, HH:MM:SS or D-HH:MM:SS, not {self.time!r}")
        for name in ("account", "partition", "logs"):
            value = getattr(self, name)
            if value is not None and not PLAIN.fullmatch(value):
                raise JobError(f"--{name} {value!r}: letters, digits and _./+,:@- only")

    def grade_options(self) -> str:
        """`grade`'s options beyond the shard and the allocation, quoted for a shell."""
        words = [w for slug in self.stages for w in ("--stage", slug)]
        words += [] if self.seed is None else ["--seed", str(self.seed)]
        return " ".join(shlex.quote(w) for w in words)


# each pod first checks the volume holds the course and the submissions (exits 11 and 12, as a
# Slurm task's), then installs theinference unless the image has it
REACHABLE = """set -eu
[ -r {course}/theinference.toml ] || {{
  echo "theinference: /work/{course}/theinference.toml is not on the volume" >&2; exit 11; }}
[ -d {submissions} ] || {{
  echo "theinference: /work/{submissions}/ is not on the volume" >&2; exit 12; }}
command -v theinference >/dev/null || pip install --quiet theinference=={version}
"""

GRADE_SCRIPT = REACHABLE + """I=$((JOB_COMPLETION_INDEX + 1))
theinference grade {submissions} --out results-$I --course-dir {course} --shard $I/{shards} \\
  {grade_options}
"""

# the merge runs whether the grading Job completed or failed: a student no pod graded gets a
# "missing" row and the merge fails, rather than waiting on the grading Job forever
MERGE_SCRIPT = REACHABLE + """status=0 shards=""
for I in $(seq 1 {shards}); do
  if [ -d results-$I/submissions ]; then shards="$shards results-$I"; else
    echo "shard $I left no results" >&2; fi
done
theinference gradebook merge $shards \\
  --out {results} --submissions {submissions} || status=$?
[ $status -gt 1 ] || theinference report {results} --html {results}/class.html || status=$?
exit $status
"""

KUBERNETES = """# Grade a class on Kubernetes in {shards} shards, then merge
# (`theinference workflow kubernetes`).
# {submissions}/ (one folder or archive per student) and {course}/ (with the course's
# theinference.toml) live on the volume claim {claim} (ReadWriteMany), which every pod mounts
# at /work. The Indexed Job's pod with completion index K grades shard K+1 of {shards} into
# results-(K+1)/; the merge Job joins the students of {submissions}/ into {results}/ with
# class.html once the grading Job has ended, complete or failed:
#
#     kubectl apply -f {name} -l step=grade
#     until kubectl get job theinference-grade -o jsonpath='{{.status.conditions[*].type}}' |
#       grep -Eq 'Complete|Failed'; do sleep 60; done
#     kubectl apply -f {name} -l step=merge
#
# A student no pod graded gets a "missing" row and the merge fails: delete both Jobs
# (kubectl delete -f {name}) and apply them again; only what is missing is graded.
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


def kubernetes_jobs(job: ClassJob, name: str, claim: str, image: str) -> str:
    fields = dict(shards=job.shards, submissions=shlex.quote(job.submissions),
                  course=shlex.quote(job.course), results=shlex.quote(job.results),
                  grade_options=job.grade_options(), version=__version__)
    return KUBERNETES.format(
        **fields, name=name, claim=claim, image=image,
        grade_script=_indent(GRADE_SCRIPT.format(**fields)),
        merge_script=_indent(MERGE_SCRIPT.format(**fields)),
    )


def _indent(script: str, by: int = 14) -> str:
    return "\n".join((" " * by + line).rstrip() for line in script.splitlines())
