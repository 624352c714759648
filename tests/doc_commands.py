"""What each `theinference` command the docs show is checked for when tests/test_docs_run.py
runs a page: its exit code, and the files the page says it writes and what they hold. A check
reads the command's options from the page's own words (`--out`, `--shards`, `--account`...),
so an edited example is checked for what it now asks."""

import csv
import json
import re
import shlex
import subprocess
import tomllib
import zipfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from tests.test_docs import run

CLASS = {"ann": "todo", "bob": "passed"}  # the template, the reference solution
GRADED = ["single-step-attention"]


@dataclass
class Page:
    """A page being run: where its next command runs, and how often each line has run."""

    cwd: Path
    env: dict
    settings: dict = field(default_factory=dict)  # folder `init` makes -> theinference.toml
    seen: Counter = field(default_factory=Counter)
    before: int = 0  # how often the line now running ran before
    applied: list = field(default_factory=list)  # the Jobs `kubectl apply` would create


def ok(done: subprocess.CompletedProcess, words: list[str], code: int = 0) -> None:
    line = shlex.join(words)
    assert done.returncode == code, f"`{line}`: {done.returncode}\n{done.stdout}{done.stderr}"
    assert "Traceback" not in done.stdout + done.stderr, line


def said(done: subprocess.CompletedProcess) -> str:
    """What the command printed: its messages go to stderr, its report to stdout."""
    return done.stdout + done.stderr


def option(words: list[str], name: str) -> str | None:
    return words[words.index(name) + 1] if name in words else None


def check_init(done, words, page):
    """A course in DIR; `--lang ts` its TypeScript files, `--ci github` its workflow."""
    ok(done, words)
    course = page.cwd / words[2]
    settings = tomllib.loads((course / "theinference.toml").read_text())
    if option(words, "--lang") == "ts":
        assert settings["language"] == "ts" and "npm install" in said(done)
        for rel in ("package.json", "package-lock.json", "tsconfig.json", "src/gpt2.ts",
                    "src/kvcache.ts", "tests/adapters.ts"):
            assert (course / rel).is_file(), rel
        package = json.loads((course / "package.json").read_text())
        assert package["type"] == "module" and "dependencies" not in package  # an ES module
        assert package["scripts"]["test"].endswith("; theinference test")  # the grader
        assert all(v[0].isdigit() for v in package["devDependencies"].values()), package
    else:
        for rel in ("src/kvcache.py", "tests/adapters.py"):
            assert (course / rel).is_file(), rel
    if option(words, "--ci") == "github":  # grades on push, keeps the results, a job summary
        text = (course / ".github" / "workflows" / "theinference.yml").read_text()
        assert "push" in yaml.safe_load(text)[True]  # YAML 1.1 reads the key `on` as true
        assert "theinference test --json results.json --junit results.xml" in text
        assert "theinference summary results.json" in text and "upload-artifact" in text
    if words[2] in page.settings:
        (course / "theinference.toml").write_text(page.settings[words[2]])


def check_autograder(done, words, page):
    """The zip to upload: Gradescope's two scripts, the course's settings, this theinference."""
    ok(done, words)
    with zipfile.ZipFile(page.cwd / option(words, "--out")) as z:
        names = set(z.namelist())
        setup = z.read("setup.sh").decode()
        settings = z.read("theinference.toml")
    assert {"run_autograder", "setup.sh", "theinference-src/theinference/cli.py"} <= names
    course = page.cwd / option(words, "-C")
    assert settings == (course / "theinference.toml").read_bytes()  # [grading] travels
    assert "bubblewrap" in setup and "gradescope warm" in setup  # oracle warmed at build


def check_grade(done, words, page):
    """A record per student with what the page lists, a gradebook row each; a rerun into the
    same folder regrades nothing."""
    ok(done, words)
    out = page.cwd / option(words, "--out")
    assert f"{out.name}/gradebook.csv" in said(done)  # every command prints what it wrote
    assert f"({len(CLASS) if page.before else 0} unchanged" in said(done), said(done)
    with (out / "gradebook.csv").open() as f:
        assert {r["student"]: r["status"] for r in csv.DictReader(f)} == dict.fromkeys(
            CLASS, "graded")
    for sid, status in CLASS.items():
        record = json.loads((out / "submissions" / f"{sid}.json").read_text())
        assert [(s["slug"], s["status"]) for s in record["stages"]] == [(GRADED[0], status)]
        assert record["results"]["stages"][0]["status"] == status  # `theinference test` JSON
        assert len(record["content_sha256"]) == 64 and "src/kvcache.py" in record["code"]
        assert set(record["provenance"]) >= {"theinference", "specs", "settings", "weights",
                                             "seed", "sandbox", "platform"}
        assert record["provenance"]["seed"] == "none"  # seed = "env", THEINFERENCE_SEED unset
        assert {"cpus", "memory_bytes", "cpus_from"} <= set(record["allocation"])


def check_report(done, words, page):
    """One static page and a page per student; similar code checked; `--since` the changes."""
    ok(done, words)
    html = page.cwd / option(words, "--html")
    assert html.name in said(done) and "similar code not checked" not in done.stderr
    text = html.read_text()
    assert "http" not in text.replace('xmlns="http://www.w3.org/2000/svg"', "")  # nothing fetched
    assert "Similar code (template subtracted)" in text
    for sid in CLASS:
        assert (html.parent / "class-students" / f"{sid}.html").is_file()
        assert f'href="class-students/{sid}.html"' in text
    if "--since" in words:
        assert f"Changes since {option(words, '--since').rstrip('/')}" in text
        assert "No grade changed" in text


def check_diff(done, words, page):
    """An unchanged regrade: exit 0, no row (the CSV its header alone)."""
    ok(done, words)
    assert done.stdout.startswith("no change"), done.stdout
    if "--csv" in words:
        assert f"wrote {option(words, '--csv')}" in done.stderr  # every command says so
        rows = (page.cwd / option(words, "--csv")).read_text().splitlines()
        assert len(rows) == 1 and rows[0].startswith("student,stage,old_status,new_status")


def check_matrix(done, words, page):
    """A job per shard, then a merge job after them."""
    ok(done, words)
    out = option(words, "--out")
    assert f"wrote {out}" in said(done)
    jobs = yaml.safe_load((page.cwd / out).read_text())["jobs"]
    shards = int(option(words, "--shards"))
    assert jobs["grade"]["strategy"]["matrix"]["shard"] == list(range(1, shards + 1))
    assert jobs["merge"]["needs"] == "grade"


def check_slurm(done, words, page):
    """The script with every option as an #SBATCH line (none not asked for), 0644, bash-parsable."""
    ok(done, words)
    script = page.cwd / option(words, "--out")
    text = script.read_text()
    assert f"SHARDS={option(words, '--shards')}\n" in text
    for name in ("--account", "--partition"):
        value = option(words, name)
        assert (f"#SBATCH {name}={value}\n" in text) if value else f"#SBATCH {name}" not in text
    assert script.stat().st_mode & 0o777 == 0o644
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0


def check_kubernetes(done, words, page):
    """An Indexed Job of N completions and a merge Job, both on the named volume claim."""
    ok(done, words)
    grade, merge = yaml.safe_load_all((page.cwd / option(words, "--out")).read_text())
    assert grade["spec"]["completionMode"] == "Indexed"
    assert grade["spec"]["completions"] == int(option(words, "--shards"))
    for job in (grade, merge):
        volume = job["spec"]["template"]["spec"]["volumes"][0]
        assert volume["persistentVolumeClaim"]["claimName"] == option(words, "--claim")


def check_test(done, words, page):
    """An untouched course: exit 1, every stage todo (the runner found, nothing broken)."""
    from theinference.curriculum.stages import load_stages

    ok(done, words, 1)
    slugs = [s.slug for s in load_stages()]
    for slug in slugs:
        assert re.search(rf"^\S+ {slug} .* TODO ", done.stdout, re.M), (slug, done.stdout)
    assert f"{len(slugs)} todo" in done.stdout, done.stdout


CHECKS = {"init": check_init, "gradescope build": check_autograder, "grade": check_grade,
          "report": check_report, "gradebook diff": check_diff, "workflow matrix": check_matrix,
          "workflow slurm": check_slurm, "workflow kubernetes": check_kubernetes,
          "test": check_test}


def command_name(words: list[str]) -> str:
    return " ".join(words[1:3] if words[1] in ("gradescope", "gradebook", "workflow")
                    else words[1:2])


def run_theinference(line, page):
    words = shlex.split(line)
    done = run(line, page.cwd, page.env)
    CHECKS[command_name(words)](done, words, page)
