"""A class of generated submissions, in every layout a class arrives in."""

import io
import shutil
import tarfile
import zipfile
from pathlib import Path

from tests.helpers import make_course, reference_text
from tests.test_hostile import PREAMBLE

SOLUTIONS = Path(__file__).parent / "solutions"


def hostile_adapters(course: Path, body: str) -> None:
    """The test_hostile catalogue's way: run_step_attention replaced by `body`."""
    adapters = course / "tests" / "adapters.py"
    text = adapters.read_text() + "\n\n" + PREAMBLE
    text += "\n\ndef run_step_attention(seq_ids):\n    w = load_weights()\n    " + body + "\n"
    adapters.write_text(text)


def course_files(course: Path) -> dict[str, bytes]:
    return {p.relative_to(course).as_posix(): p.read_bytes()
            for p in sorted(course.rglob("*")) if p.is_file()}


def as_zip(path: Path, files: dict[str, bytes], wrapper: str = "") -> None:
    with zipfile.ZipFile(path, "w") as z:
        for name, data in files.items():
            z.writestr(f"{wrapper}{name}", data)


def as_tar(path: Path, files: dict[str, bytes], wrapper: str = "") -> None:
    with tarfile.open(path, "w:gz") as t:
        for name, data in files.items():
            info = tarfile.TarInfo(f"{wrapper}{name}")
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))


def add(folder: Path, sid: str, kvcache: str, layout: str = "dir", body: str | None = None,
        scratch: Path | None = None) -> None:
    """One student: a course folder, a .zip (wrapped in a folder), a .tar.gz, or loose
    files (kvcache.py, and adapters.py when the adapters are the student's own)."""
    scratch = scratch or folder.parent / "scratch"
    course = make_course(scratch / sid, kvcache)
    if body is not None:
        hostile_adapters(course, body)
    files = course_files(course)
    if layout == "dir":
        course.rename(folder / sid)
    elif layout == "zip":
        as_zip(folder / f"{sid}.zip", files, wrapper=f"{sid}-main/")
    elif layout == "tar":
        as_tar(folder / f"{sid}.tar.gz", files)
    else:  # loose
        (folder / sid).mkdir()
        (folder / sid / "kvcache.py").write_text(kvcache)
        if body is not None:
            (folder / sid / "adapters.py").write_bytes(files["tests/adapters.py"])


def reference() -> str:
    return reference_text()


def independent() -> str:
    return (SOLUTIONS / "independent_kvcache.py").read_text()


def small_class(folder: Path) -> Path:
    """submissions/ (three students whose verdicts come fast: two shards of three draw them,
    one draws none; graded ann todo, bob error, cyd failed) and course/ grading one stage."""
    subs = folder / "submissions"
    subs.mkdir(parents=True)
    add(subs, "ann", None, scratch=folder / "scratch")
    add(subs, "bob", None, "zip", "raise RuntimeError('not yet')", folder / "scratch")
    add(subs, "cyd", reference(), "loose", "return [0.0, 1.0]", folder / "scratch")
    course = make_course(folder / "course")
    (course / "theinference.toml").write_text(
        '[grading]\nstages = ["single-step-attention"]\ntimeout = 60\n')
    shutil.rmtree(folder / "scratch")
    return folder
