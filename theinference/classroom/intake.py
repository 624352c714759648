"""Submissions as they arrive (a course directory, a .zip or .tar.gz of one, a folder of
loose files, or a notebook) turned into a course directory to grade, without trusting their
contents. A notebook (an .ipynb, or one alone in a folder or archive that holds no kvcache.py)
is graded as the course directory its code makes (course/notebook.py: docs/notebooks.md).

Archives are read member by member: no absolute path, no `..`, no link or device, and caps on
the file count and on the bytes actually read (a declared size can lie). A directory's symlinks
are refused too, so nothing outside the submission is ever read or graded. The student's files
are laid over a fresh template of their language (a TypeScript submission is known by its
kvcache.ts or adapters.ts; a submission with neither, or both languages, is in the course's),
and the instructor's theinference.toml always wins, but for the language it names.
"""

import hashlib
import re
import shutil
import stat
import tarfile
import tomllib
import zipfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from theinference.course import languages
from theinference.course.directory import SETTINGS_FILE, TEMPLATE_DIR, init_course, template_files
from theinference.course.languages import Language, LanguageError
from theinference.course.notebook import NOTEBOOK_SUFFIX, NotebookError, notebook_course_files

MAX_FILES = 2000
MAX_BYTES = 64 << 20  # a whole submission, unpacked
ARCHIVE_SUFFIXES = (".zip", ".tar.gz", ".tgz")
IGNORED_PARTS = {"__pycache__", ".git", ".theinference", ".venv", "node_modules", "__MACOSX",
                 ".ipynb_checkpoints"}  # Jupyter's autosaves: never a second notebook
OWN_CODE = tuple(path for language in languages.ALL for path in language.own_code)
KVCACHE_NAMES = {PurePosixPath(path).name for language in languages.ALL
                 for path in language.own_code if "kvcache" in path}
OWN_CODE_CHARS = 200_000  # per file kept in the record, for the similarity check


class IntakeError(Exception):
    """A submission that cannot be taken as it is; the message says why (it gets its row)."""


@dataclass(frozen=True)
class Submission:
    id: str  # the student: the entry's name without its archive suffix
    path: Path


def discover(folder: Path) -> tuple[list[Submission], list[str]]:
    """Every submission in the folder, sorted by id, and the entries that are none."""
    found, skipped = [], []
    for entry in sorted(folder.iterdir()):
        if entry.name.startswith("."):
            continue
        sid = student_id(entry)
        if sid is None:
            skipped.append(entry.name)
        else:
            found.append(Submission(sid, entry))
    ids = [s.id for s in found]
    twice = sorted({i for i in ids if ids.count(i) > 1})
    if twice:
        raise IntakeError(f"two submissions share the id {', '.join(twice)}: rename one")
    return found, skipped


def student_id(entry: Path) -> str | None:
    if entry.is_dir() and not entry.is_symlink():
        return entry.name
    for suffix in (*ARCHIVE_SUFFIXES, NOTEBOOK_SUFFIX):
        if entry.name.endswith(suffix) and entry.is_file() and not entry.is_symlink():
            return entry.name[: -len(suffix)]
    return None


def read_files(sub: Submission) -> dict[str, bytes]:
    """The submission's files by relative POSIX path, checked, one wrapping folder stripped."""
    if sub.path.is_dir():
        files = _read_directory(sub.path)
    elif sub.path.name.endswith(".zip"):
        files = _read_zip(sub.path)
    elif sub.path.name.endswith(NOTEBOOK_SUFFIX):
        with sub.path.open("rb") as stream:
            files = {sub.path.name: _read_capped(stream, sub.path.name, _Budget())}
    else:
        files = _read_tar(sub.path)
    files = {k: v for k, v in files.items() if not IGNORED_PARTS & set(k.split("/"))}
    return _from_notebook(_strip_wrapper(files))


def _from_notebook(files: dict[str, bytes]) -> dict[str, bytes]:
    """A submission of one notebook, and no kvcache.py, as the course files its code makes."""
    notebooks = [name for name in files if name.endswith(NOTEBOOK_SUFFIX)]
    if not notebooks or any(name.rsplit("/", 1)[-1] in KVCACHE_NAMES for name in files):
        return files
    if len(notebooks) > 1:
        raise IntakeError(f"{len(notebooks)} notebooks and no kvcache.py: submit one notebook "
                          f"({', '.join(sorted(notebooks))})")
    try:
        made = notebook_course_files(files[notebooks[0]])
    except NotebookError as exc:
        raise IntakeError(f"{notebooks[0]}: {exc}") from None
    others = {k: v for k, v in files.items() if k != notebooks[0]}
    return others | made


def content_hash(files: dict[str, bytes]) -> str:
    digest = hashlib.sha256()
    for name in sorted(files):
        data = files[name]
        digest.update(f"{name}\0{len(data)}\0".encode())
        digest.update(data)
    return digest.hexdigest()


def submission_language(files: dict[str, bytes], settings_toml: bytes | None) -> Language:
    """The language of a submission's own files (src/kvcache.ts or tests/adapters.ts, also
    loose): when they say one language, that one; else the instructor's course's."""
    said = []
    for language in languages.ALL:
        names = set(language.own_code)
        names |= {n.rsplit("/", 1)[-1] for n in names}
        if names & set(files):
            said.append(language)
    return said[0] if len(said) == 1 else course_language(settings_toml)


def course_language(settings_toml: bytes | None) -> Language:
    """The `language` the instructor's theinference.toml names (the default when it names
    none, or none that is one: open_course reports the file when the submission is graded)."""
    try:
        said = tomllib.loads((settings_toml or b"").decode()).get("language")
        return languages.parse(said) or languages.DEFAULT
    except (UnicodeDecodeError, tomllib.TOMLDecodeError, LanguageError):
        return languages.DEFAULT


def lay_over_template(
    files: dict[str, bytes], dest: Path, settings_toml: bytes | None,
    language: Language = languages.DEFAULT,
) -> Path:
    """A fresh course at dest in `language` with the student's files placed where its template
    has them (a loose `kvcache.py` goes to src/kvcache.py), and the instructor's settings."""
    init_course(dest, language)
    by_name = _template_basenames(language)
    for name, data in files.items():
        target = by_name.get(name, name) if "/" not in name else name
        if target == SETTINGS_FILE:
            continue
        path = dest / target
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    if settings_toml is not None:
        (dest / SETTINGS_FILE).write_bytes(with_language(settings_toml, language))
    return dest


def own_code(files: dict[str, bytes]) -> dict[str, str]:
    """The student's own source, by where the course keeps it (a loose `kvcache.py` is
    src/kvcache.py): the files similarity compares (classroom/similarity.py)."""
    loose = {PurePosixPath(path).name: path for path in OWN_CODE}
    placed = {(name if "/" in name else loose.get(name, name)): data
              for name, data in files.items()}
    return {path: placed[path].decode("utf-8", errors="replace")[:OWN_CODE_CHARS]
            for path in OWN_CODE if path in placed}


def with_language(settings_toml: bytes, language: Language) -> bytes:
    """The instructor's settings naming this submission's language (a mixed class grades each
    submission in its own): any top-level `language` line replaced by one at the top, when
    the settings name another."""
    if course_language(settings_toml) is language:
        return settings_toml
    text = settings_toml.decode(errors="replace")
    first_table = re.search(r"(?m)^[ \t]*\[", text)  # top-level keys come before it
    cut = first_table.start() if first_table else len(text)
    head = re.sub(r"(?m)^[ \t]*language[ \t]*=.*(\n|$)", "", text[:cut])
    return f'language = "{language.name}"\n{head}{text[cut:]}'.encode()


def _template_basenames(language: Language = languages.DEFAULT) -> dict[str, str]:
    """A top-level file named like exactly one template file goes where that file is."""
    names: dict[str, list[str]] = {}
    for rel in template_files(language.template):
        names.setdefault(rel.name, []).append(rel.as_posix())
    return {n: paths[0] for n, paths in names.items() if len(paths) == 1 and n != "__init__.py"}


def _safe_name(name: str) -> str:
    path = PurePosixPath(name.replace("\\", "/"))
    if path.is_absolute() or ".." in path.parts or name.startswith("/"):
        raise IntakeError(f"refused: the archive writes outside itself ({name!r})")
    return path.as_posix()


class _Budget:
    def __init__(self):
        self.files = self.bytes = 0

    def take(self, name: str, size: int) -> None:
        self.files += 1
        self.bytes += size
        if self.files > MAX_FILES:
            raise IntakeError(f"refused: more than {MAX_FILES} files")
        if self.bytes > MAX_BYTES:
            raise IntakeError(f"refused: more than {MAX_BYTES >> 20} MiB unpacked (at {name})")


def _read_capped(stream, name: str, budget: _Budget) -> bytes:
    data = stream.read(MAX_BYTES - budget.bytes + 1)
    budget.take(name, len(data))
    return data


def _read_zip(path: Path) -> dict[str, bytes]:
    budget, files = _Budget(), {}
    try:
        with zipfile.ZipFile(path) as archive:
            for info in archive.infolist():
                name = _safe_name(info.filename)
                mode = info.external_attr >> 16
                if stat.S_ISLNK(mode):
                    raise IntakeError(f"refused: the archive holds a link ({name})")
                if info.is_dir():
                    continue
                with archive.open(info) as stream:
                    files[name] = _read_capped(stream, name, budget)
    except (zipfile.BadZipFile, EOFError, OSError, NotImplementedError) as exc:
        raise IntakeError(f"not a readable .zip: {exc}") from None
    return files


def _read_tar(path: Path) -> dict[str, bytes]:
    budget, files = _Budget(), {}
    try:
        with tarfile.open(path, "r:*") as archive:
            for member in archive:
                name = _safe_name(member.name)
                if member.isdir():
                    continue
                if not member.isfile():
                    raise IntakeError(f"refused: the archive holds a link or device ({name})")
                stream = archive.extractfile(member)
                files[name] = _read_capped(stream, name, budget)
    except (tarfile.TarError, EOFError, OSError) as exc:
        raise IntakeError(f"not a readable .tar.gz: {exc}") from None
    return files


def _read_directory(root: Path) -> dict[str, bytes]:
    budget, files = _Budget(), {}
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root).as_posix()
        if IGNORED_PARTS & set(rel.split("/")):
            continue
        if path.is_symlink():
            raise IntakeError(f"refused: the submission holds a symlink ({rel})")
        if path.is_file():
            with path.open("rb") as stream:
                files[rel] = _read_capped(stream, rel, budget)
    return files


def _strip_wrapper(files: dict[str, bytes]) -> dict[str, bytes]:
    """`alice/src/kvcache.py` -> `src/kvcache.py` when everything sits in one folder that is
    not itself part of a course (src/, tests/)."""
    tops = {name.split("/", 1)[0] for name in files}
    if len(tops) != 1 or all("/" not in n for n in files):
        return files
    (top,) = tops
    if (TEMPLATE_DIR / top).is_dir():
        return files
    return _strip_wrapper({name.split("/", 1)[1]: data for name, data in files.items()})


def remove_tree(path: Path) -> None:
    """A graded copy goes, whatever the student's code left in it (read-only folders too)."""
    for folder in (path, *(p for p in path.rglob("*") if p.is_dir() and not p.is_symlink())):
        try:
            folder.chmod(0o700)
        except OSError:
            pass
    shutil.rmtree(path, ignore_errors=True)
