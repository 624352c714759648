"""The grader's installation out of the student's reach (student/reach.py, launch.py): the
calibration and a measured call's worker start without site processing, so a .pth file the
student's code leaves in the grader's site-packages never runs in them; and where the student's
process can write that installation at all, no cost proof passes and no class is graded.

The forgeries run in a grader installation this test makes and lets the student write: a
throwaway venv whose site-packages links the real one's packages, a throwaway HOME, and the
grader started from that venv's Python in a process of its own."""

import json
import os
import site
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from theinference import exits
from theinference.classroom import class_run as grade
from theinference.student import reach, sandbox
from theinference.student.sandbox import Sandbox

# the student's adapters: `plant` (an unmeasured call) leaves a .pth file in the site-packages
# of the Python it runs under; the .pth says where it ran (the worker's mode, from its command
# line), burns CPU in a calibration (a lower rate makes a lenient floor) and starts a helper
# in a measured worker, before its seccomp filter (the helper would do the work unseen)
PLANTER = '''
import os, site

PTH = (
    "import os, sys, time; "
    "mode = next((m for m in ('calibrate', 'guarded', 'measured', 'adapters') "
    "if m in sys.orig_argv), 'other'); "
    "open(os.path.join({marks!r}, 'ran-' + mode + '-' + str(os.getpid())), 'w').close(); "
    "end = time.process_time() + (2.0 if mode == 'calibrate' else 0); "
    "[0 for _ in iter(lambda: time.process_time() < end, False)]; "
    "mode in ('guarded', 'measured') and os.fork() == 0 and (time.sleep(30), os._exit(0))\\n"
)

def plant(marks):
    path = os.path.join(site.getsitepackages()[0], "zz_forgery.pth")
    with open(path, "w") as f:
        f.write(PTH.format(marks=marks))
    return [1.0]

def work(ids):
    return [float(sum(range(1000)))]
'''

DRIVER = '''
import json, sys
from pathlib import Path
from theinference.student import calibration, reach
from theinference.student.process import StudentProcess
from theinference.student.sandbox import Sandbox
from theinference.student.setup import Limits, ProcessSetup

course, marks, trusted = Path(sys.argv[1]), sys.argv[2], sys.argv[3] == "trusted"
if trusted:  # taken as out of reach: what the -S start alone holds back
    reach.writable_install = lambda kind: ()
setup = ProcessSetup(course, Path("/nonexistent"), Limits(timeout=60), sandbox=Sandbox("none"))
with StudentProcess(setup) as student:
    planted = student.call("plant", [marks])
    rate, why = calibration.rate_now(student)
    alone = student.call_alone("work", [[1]], 60, 30.0)
    after = student.call("work", [[1]])  # a fresh ordinary worker: the .pth runs there
    notes = student.notes
print(json.dumps({"planted": planted.kind, "rate": rate, "why": why, "alone": alone.kind,
                  "alone_message": alone.message, "after": after.kind, "notes": notes}))
'''


def throwaway_install(root: Path) -> Path:
    """A venv of this Python's base whose site-packages links every package of the real one
    (not its .pth files): the grader's installation, writable, and nobody else's. Its Python."""
    venv = root / "grader-venv"
    base = getattr(sys, "_base_executable", sys.executable)
    subprocess.run([base, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    own = subprocess.run([python, "-c", "import site; print(site.getsitepackages()[0])"],
                         capture_output=True, text=True, check=True).stdout.strip()
    for entry in Path(site.getsitepackages()[0]).iterdir():
        if entry.suffix != ".pth" and entry.name != "__pycache__":
            (Path(own) / entry.name).symlink_to(entry)
    return python


def course_with_planter(root: Path) -> Path:
    for folder in ("tests", "src"):
        (root / folder).mkdir(parents=True)
        (root / folder / "__init__.py").write_text("")
    (root / "tests" / "adapters.py").write_text(textwrap.dedent(PLANTER))
    return root


@pytest.mark.slow
@pytest.mark.parametrize("trust", ["trusted", "writable"])
def test_a_pth_file_planted_in_the_graders_install_fails_by_the_proof(trust, tmp_path):
    """Catches a .pth file left by an unmeasured call in the grader's site-packages running in
    the calibration (burning CPU there lowers the rate, and so the floor) or in a measured
    call's worker (a helper forked before its seccomp filter would do the work unseen): it
    must run in neither (their -S start), and where the student's process can write the
    install, the calibration and the measured call must fail saying the check cannot apply."""
    python = throwaway_install(tmp_path)
    course = course_with_planter(tmp_path / "c")
    marks = tmp_path / "marks"
    marks.mkdir()
    home = tmp_path / "home"
    home.mkdir()
    env = {"PATH": os.environ.get("PATH", ""), "HOME": str(home),
           "PYTHONPATH": str(Path(__file__).parents[1])}
    done = subprocess.run([python, "-c", DRIVER, str(course), str(marks), trust], env=env,
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    ran = sorted(p.name.split("-")[1] for p in marks.iterdir())
    assert seen["planted"] == "returned" and seen["after"] == "returned", seen
    assert "adapters" in ran, f"the planted .pth never ran, so this test cannot tell: {ran}"
    assert not {"calibrate", "guarded", "measured"} & set(ran), f"the .pth ran in: {ran}"
    if trust == "trusted":
        assert seen["rate"] is not None and seen["alone"] == "returned", seen
    else:
        assert seen["rate"] is None and "can write the grader's installation" in seen["why"]
        assert seen["alone"] == "unaccounted", seen
        assert "cannot apply" in seen["alone_message"], seen["alone_message"]
        assert any("can write the grader's installation" in n for n in seen["notes"]), seen


@pytest.mark.install_reach
def test_what_the_student_can_write_is_read_per_sandbox(tmp_path, monkeypatch):
    """Catches a reach check that trusts an install a fresh uid could write (a folder writable
    by others), that blames one it cannot, or that blames bwrap's read-only binds."""
    open_to_all, roots_only = tmp_path / "open", tmp_path / "closed"
    for folder, mode in ((open_to_all, 0o777), (roots_only, 0o755)):
        folder.mkdir()
        folder.chmod(mode)
    monkeypatch.setattr(reach, "install_paths", lambda: (open_to_all, roots_only))
    assert reach.writable_install(Sandbox("unprivileged-user")) == (str(open_to_all),)
    assert reach.writable_install(Sandbox("bwrap")) == ()
    expected = tuple(str(p) for p in (open_to_all, roots_only) if os.access(p, os.W_OK))
    assert reach.writable_install(Sandbox("none")) == expected


def test_the_measured_workers_start_without_site_processing():
    """Catches a calibration or measured worker started with site processing (a .pth file in
    the grader's site-packages would run in it, -I or not), or without the folders it needs
    named (it could not import NumPy)."""
    from theinference.course.languages import PYTHON
    from theinference.student import launch

    for mode in ("calibrate", "guarded", "measured"):
        argv = launch.worker_argv(Path("/course"), (3, 4), 2**30, PYTHON, mode=mode)
        flags = argv[1:argv.index(str(launch.WORKER_DIR / PYTHON.worker))]
        assert "-S" in flags and "-I" in flags, (mode, flags)
        named = flags[flags.index("-X") + 1].split("=", 1)[1].split(os.pathsep)
        found = subprocess.run([sys.executable, "-I", "-S", "-c",
                                f"import sys; sys.path += {named!r}; import numpy"], check=False)
        assert found.returncode == 0, f"NumPy cannot be imported from {named}"
    assert "-S" not in launch.worker_argv(Path("/c"), (3, 4), 2**30, PYTHON)[1:3]


@pytest.mark.install_reach
def test_a_class_is_never_graded_where_a_submission_can_write_the_grader(monkeypatch):
    """Catches `grade` running a class where one submission's code could change the grader of
    the next (its install writable by the student's process): it refuses, saying why."""
    monkeypatch.setattr(sandbox, "choose", lambda mode: Sandbox("none"))
    monkeypatch.setattr(reach, "writable_install", lambda kind: ("/grader/site-packages",))
    with pytest.raises(exits.Abort) as refused:
        grade.grading_sandbox(None)
    assert refused.value.code == exits.USAGE
    assert "refusing to grade a class" in str(refused.value), refused.value
    monkeypatch.setattr(reach, "writable_install", lambda kind: ())
    assert grade.grading_sandbox(None).kind == "none"


@pytest.mark.install_reach
def test_where_the_student_can_write_the_install_no_cost_proof_is_measured(tmp_path):
    """Catches a calibration or a measured call made where the student's process can write
    the grader's installation (here the grader's own user's, as `--sandbox none` runs it):
    both must fail saying the check cannot apply, and the run's notes must say why."""
    from theinference.student import calibration
    from theinference.student.process import StudentProcess
    from theinference.student.setup import Limits, ProcessSetup

    if not reach.writable_install(Sandbox("none")):
        pytest.skip("this user cannot write the grader's installation: nothing to refuse")
    course = course_with_planter(tmp_path / "c")
    setup = ProcessSetup(course, Path("/nonexistent"), Limits(timeout=60),
                         sandbox=Sandbox("none"))
    with StudentProcess(setup) as student:
        rate, why = calibration.measure(student)
        alone = student.call_alone("work", [[1]], 60, 30.0)
        notes = student.notes
    assert rate is None and "can write the grader's installation" in why, why
    assert alone.kind == "unaccounted" and "cannot apply" in alone.message, alone.message
    assert any("the cost checks fail saying they cannot apply" in n for n in notes), notes
