"""Which CPU account a run's measured calls have, chosen at run time, and the words for it.

- cgroup v2 / cgroup v1: a cgroup per student worker (cgroups.py), which the student's process
  cannot leave: under bubblewrap it runs as uid 65534 in a user namespace that owns nothing of
  the host's cgroupfs (and bwrap starts inside the cgroup, so its cgroup namespace is rooted
  there); as an unprivileged user it runs as a fresh uid that owns nothing of it. Every process
  it starts, however it ends, is counted.
- seccomp: no cgroup it cannot leave (none writable here, or the student's process runs as the
  grader's own user, `--sandbox none`, and could move itself out): a measured call runs in a
  worker that is forbidden to start a process (worker/guard.py), so its /proc tree measure
  (cpu.py) is all of it; a call that tries fails, saying so.
- none: neither (a TypeScript worker cannot be guarded: Node, through tsx, starts a helper
  process of its own): a measured call cannot be checked, and fails saying so.
"""

from dataclasses import dataclass

from theinference.course.languages import Language
from theinference.student import cgroups
from theinference.student.sandbox import Sandbox

CANNOT_APPLY = "the cost check cannot apply here, and a check that cannot apply does not pass"
STARTED_A_PROCESS = (
    "the call started a process, and this machine gives the grader no CPU account that counts "
    "one ({why}): a measured call must do its work in its own process, where its CPU time is "
    "seen"
)


@dataclass(frozen=True)
class Account:
    """A run's CPU account: kind is cgroup-v2, cgroup-v1, seccomp or none."""

    kind: str
    cgroup_home: cgroups.Home | None  # where workers' cgroups are made (cgroup kinds only)
    why_no_cgroup: str  # "" for a cgroup kind
    # where a worker's cgroup is made only to hold its processes (no account: the student's
    # process could leave it), so that the end of a call can freeze and empty it (reaper.py)
    containment: cgroups.Home | None = None

    @property
    def cgroup_place(self) -> cgroups.Home | None:
        """Where each worker's cgroup is made, for its account or only to hold it."""
        return self.cgroup_home or self.containment

    @property
    def note(self) -> str:
        """What the run's notes say of it: nothing for a cgroup (the JSON's `cpu_account`
        names it), else why there is none and what follows, as the sandbox's notes do."""
        if self.cgroup_home is not None:
            return ""
        if self.kind == "seccomp":
            return (
                f"CPU account: no cgroup the student's process cannot leave ({self.why_no_cgroup})"
                "; measured calls run with starting a process forbidden (seccomp), and a call "
                "that tries fails"
            )
        return (
            f"CPU account: none that counts every process ({self.why_no_cgroup}), and a "
            "TypeScript worker cannot be kept from starting one: the checks of a call's CPU time "
            "fail saying they cannot apply"
        )


def choose(sandbox: Sandbox, language: Language) -> Account:
    """The account this run's measured calls get, for its sandbox and course language: a
    cgroup only where the student's process cannot leave it (not as the grader's own user)."""
    place, why = cgroups.home()
    if place is not None and not sandbox.traits.own_user:
        return Account(f"cgroup-v{place.version}", place, "")
    if place is not None:
        why = "the student's process runs as the grader's own user and could move itself out"
    kind = "seccomp" if language.guardable else "none"  # its worker installs the filter
    return Account(kind, None, why, containment=place)


def no_account(account: Account) -> str:
    """Why a measured call cannot be checked under an account of kind none."""
    return (
        f"the grader has no CPU account here that counts every process a call may start "
        f"({account.why_no_cgroup}), and a TypeScript worker cannot be kept from starting one: "
        + CANNOT_APPLY
    )
