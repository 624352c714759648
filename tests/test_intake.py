"""Submissions as they arrive: archives that try to write outside themselves, links, floods
of bytes are refused; wrapping folders and loose files land where the course has them."""

import io
import os
import tarfile
import zipfile

import pytest

from theinference.classroom import intake
from theinference.classroom.intake import IntakeError, Submission, lay_over_template, read_files


def zip_of(path, members: dict[str, bytes], links: dict[str, str] = ()) -> Submission:
    with zipfile.ZipFile(path, "w") as z:
        for name, data in members.items():
            z.writestr(name, data)
        for name, target in dict(links).items():
            info = zipfile.ZipInfo(name)
            info.external_attr = (0o120777) << 16
            z.writestr(info, target)
    return Submission(path.name.removesuffix(".zip"), path)


def tar_of(path, members: dict[str, bytes], link: tuple[str, str] | None = None) -> Submission:
    with tarfile.open(path, "w:gz") as t:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))
        if link:
            info = tarfile.TarInfo(link[0])
            info.type, info.linkname = tarfile.SYMTYPE, link[1]
            t.addfile(info)
    return Submission(path.name.removesuffix(".tar.gz"), path)


@pytest.mark.parametrize("name", ["../evil.py", "/etc/evil.py", "src/../../evil.py"])
def test_archives_that_write_outside_themselves_are_refused(tmp_path, name):
    """Would catch path traversal (zip slip) through a .zip or a .tar.gz."""
    for sub in (zip_of(tmp_path / "a.zip", {name: b"x"}),
                tar_of(tmp_path / "a.tar.gz", {name: b"x"})):
        with pytest.raises(IntakeError, match="outside"):
            read_files(sub)
    assert not (tmp_path.parent / "evil.py").exists()


def test_links_are_refused_in_archives_and_folders(tmp_path):
    """Would catch a symlink that makes the grader read (or grade) a file outside the
    submission, e.g. /etc/passwd as kvcache.py."""
    with pytest.raises(IntakeError, match="link"):
        read_files(zip_of(tmp_path / "z.zip", {"a.py": b"1"}, {"src/kvcache.py": "/etc/passwd"}))
    with pytest.raises(IntakeError, match="link"):
        read_files(tar_of(tmp_path / "t.tar.gz", {"a.py": b"1"}, ("src/kvcache.py", "/etc")))
    folder = tmp_path / "dir"
    (folder / "src").mkdir(parents=True)
    os.symlink("/etc/passwd", folder / "src" / "kvcache.py")
    with pytest.raises(IntakeError, match="symlink"):
        read_files(Submission("dir", folder))


def test_size_and_count_caps_hold(tmp_path, monkeypatch):
    """Would catch a zip bomb or a flood of files read whole into memory."""
    monkeypatch.setattr(intake, "MAX_BYTES", 1000)
    with pytest.raises(IntakeError, match="MiB"):
        read_files(zip_of(tmp_path / "big.zip", {"a.py": b"0" * 5000}))
    monkeypatch.setattr(intake, "MAX_FILES", 3)
    with pytest.raises(IntakeError, match="more than 3 files"):
        read_files(tar_of(tmp_path / "many.tar.gz", {f"f{i}.py": b"" for i in range(5)}))


def test_a_broken_archive_is_a_clear_refusal(tmp_path):
    """Would catch a corrupt upload crashing the class run instead of getting its row."""
    (tmp_path / "bad.zip").write_bytes(b"PK\x03\x04 not really")
    with pytest.raises(IntakeError, match="not a readable"):
        read_files(Submission("bad", tmp_path / "bad.zip"))


def test_loose_files_and_wrappers_land_where_the_course_has_them(tmp_path):
    """Would catch a Gradescope-style upload (loose kvcache.py) or a zipped folder graded
    against the template's stubs instead of the student's code, or the student's
    theinference.toml (e.g. own weights) winning over the instructor's."""
    sub = zip_of(tmp_path / "s.zip", {"alice-main/kvcache.py": b"# mine\n",
                                      "alice-main/theinference.toml": b'weights = "mine"\n',
                                      "alice-main/helper.py": b"x = 1\n"})
    files = read_files(sub)
    assert set(files) == {"kvcache.py", "theinference.toml", "helper.py"}
    course = lay_over_template(files, tmp_path / "course", b'weights = "synthetic"\n')
    assert (course / "src" / "kvcache.py").read_text() == "# mine\n"
    assert (course / "helper.py").read_text() == "x = 1\n"
    assert (course / "theinference.toml").read_text() == 'weights = "synthetic"\n'
    assert (course / "tests" / "adapters.py").is_file()


def test_discover_names_students_and_skips_strays(tmp_path):
    """Would catch an archive graded under its file name with the suffix, or a stray file
    taken as a student."""
    (tmp_path / "bob").mkdir()
    (tmp_path / "carol.tar.gz").write_bytes(b"")
    (tmp_path / "dave.zip").write_bytes(b"")
    (tmp_path / "notes.txt").write_text("hi")
    found, skipped = intake.discover(tmp_path)
    assert [s.id for s in found] == ["bob", "carol", "dave"] and skipped == ["notes.txt"]
