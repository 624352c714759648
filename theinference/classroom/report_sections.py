"""The class report's sections beyond the grades: what changed since an earlier run
(regrade.py), whose cache is fastest (grading/speed.py's figure in each record), whose code
is shared (similarity.py) and what each grading job had (batch.job_share in each record).
Each returns HTML with every student-made string escaped."""

from collections import Counter

from theinference.classroom.regrade import Regrade
from theinference.classroom.similarity import Pair
from theinference.classroom.svg import histogram
from theinference.results.submission import Record
from theinference.results.text import html_text as escape  # controls shown, not kept


def record_speed(record: Record) -> dict | None:
    return record.results.speed if record.results else None


def speed_rows(records: list[Record]) -> tuple[list[tuple[str, dict]], list[tuple[str, str]]]:
    """(student, figure) ranked fastest first; (student, status) for those without one: the
    generate loop's status, or the record's own when it was never graded (rejected). Empty
    when no record was timed (speed was off)."""
    if not any(record_speed(r) is not None for r in records):
        return [], []
    ranked, unranked = [], []
    for r in records:
        speed = record_speed(r) or {"status": r.status}
        if speed.get("status") == "measured" and speed.get("ratio") is not None:
            ranked.append((r.id, speed))
        else:
            unranked.append((r.id, str(speed.get("status", "not measured"))))
    ranked.sort(key=lambda row: (-row[1]["ratio"], row[0]))
    return ranked, sorted(unranked)


def speed_section(records: list[Record]) -> str:
    """A ranked table and the distribution of the ratios; empty when speed was not on."""
    ranked, unranked = speed_rows(records)
    if not ranked and not unranked:
        return ""
    rows = "".join(
        f"<tr><td>{i}</td><td>{escape(sid)}</td><td>{s['ratio']:.2f}x</td>"
        f"<td>{s['decode_ms']:.1f}</td><td>{s['tokens_per_cpu_second']:.1f}</td></tr>"
        for i, (sid, s) in enumerate(ranked, 1))
    rows += "".join(f"<tr><td>-</td><td>{escape(sid)}</td><td class={escape(status)}>"
                    f"{escape(status)}</td><td></td><td></td></tr>" for sid, status in unranked)
    return (
        "<section id=speed><h2>Cached generation speed</h2>"
        "<p>Each passing submission's decode step at a long context against the oracle's own "
        "cached decode, both timed in CPU seconds in the same job and sandbox (above 1: faster "
        "than the oracle). Not part of any score; a submission whose generate loop did not "
        "pass shows its status.</p>"
        "<table><tr><th>rank</th><th>student</th><th>speed (x oracle)</th>"
        "<th>decode step (ms of CPU)</th><th>tokens per CPU second</th></tr>"
        f"{rows}</table>"
        + histogram([s["ratio"] for _, s in ranked], "speed, x the oracle's decode step", mark=1.0)
        + "</section>"
    )


def job_text(share: dict) -> str:
    """`1 CPU and 9.5 GiB each, 1 at once, of 1 CPU (affinity) and 9.5 GiB (memory limit)`"""
    return (f"{share['cpus']} CPU{'s' if share['cpus'] != 1 else ''} and "
            f"{gib(share['memory_bytes'])} each, {share['jobs']} at once, of "
            f"{share['allocation_cpus']} CPU{'s' if share['allocation_cpus'] != 1 else ''} "
            f"({share['cpus_from']}) and {gib(share['allocation_memory_bytes'])} "
            f"({share['memory_from']})")


def gib(size: int) -> str:
    return f"{size / 2**30:.1f} GiB"


SHARE_KEYS = ("jobs", "cpus", "memory_bytes", "allocation_cpus", "allocation_memory_bytes",
              "cpus_from", "memory_from")


def has_share(record: Record) -> bool:
    share = record.allocation
    return isinstance(share, dict) and all(key in share for key in SHARE_KEYS)


def share_row(s: dict) -> tuple[str, ...]:
    """The table's cells for one job's share (memory to a tenth of a GiB, so the jobs of one
    allocation read once per run share a row)."""
    return (str(s["jobs"]), str(s["cpus"]), gib(s["memory_bytes"]),
            f"{s['allocation_cpus']} ({s['cpus_from']})",
            f"{gib(s['allocation_memory_bytes'])} ({s['memory_from']})")


def allocation_section(records: list[Record]) -> str:
    """What the jobs that graded the class had: CPUs (the BLAS threads each job was given)
    and memory, shared out of the allocation the grader read, and where those figures came
    from; a row per distinct share, with how many submissions it graded. Empty when no
    record says (every one reused from before this was recorded, or none ran)."""
    shares = Counter(share_row(r.allocation) for r in records if has_share(r))
    if not shares:
        return ""
    rows = [f"<tr>{''.join(f'<td>{escape(cell)}</td>' for cell in row)}<td>{count}</td></tr>"
            for row, count in sorted(shares.items(), key=lambda item: (-item[1], item[0]))]
    return (
        "<section id=allocation><h2>What each grading job had</h2>"
        "<p>The CPUs and memory the grader read for its allocation (CPU affinity, a cgroup's "
        "CPU quota or memory limit, a scheduler's figure passed as <code>--cpus</code> or "
        "<code>--memory</code>, else the machine), shared out among the submissions graded "
        "at once: each job's CPUs are its BLAS threads. Timeouts and run times read against "
        "these.</p>"
        "<table><tr><th>at once</th><th>CPUs per job</th><th>memory per job</th>"
        "<th>allocation CPUs (from)</th><th>allocation memory (from)</th>"
        f"<th>submissions</th></tr>{''.join(rows)}</table></section>"
    )


def changes_section(regrade: Regrade, since: str) -> str:
    """gradebook diff's table: whose grade moved since `since`, and the recorded reason."""
    head = f"<section id=changes><h2>Changes since {escape(since)}</h2>"
    if regrade.differing:
        moved = ", ".join(f"{escape(name)} ({count} of {regrade.students})"
                          for name, count in sorted(regrade.differing.items()))
        head += f"<p>Recorded inputs that differ: {moved}.</p>"
    if not regrade.changes:
        return head + "<p>No grade changed.</p></section>"
    rows = "".join(
        f"<tr><td>{escape(c.student)}</td><td>{escape(c.stage)}</td>"
        f"<td class={escape(c.old_status)}>{escape(c.old_status)}</td>"
        f"<td class={escape(c.new_status)}>{escape(c.new_status)}</td>"
        f"<td>{c.old_score:g} &rarr; {c.new_score:g}</td>"
        f"<td>{escape(c.new_bug or c.old_bug or '')}</td>"
        f"<td>{'' if c.worst_error is None else f'{c.worst_error:.3g}'}</td>"
        f"<td>{escape(', '.join(c.cases_added + [f'-{n}' for n in c.cases_removed]))}</td>"
        f"<td>{escape(', '.join(c.because) or 'nothing recorded')}</td></tr>"
        for c in regrade.changes)
    return (head + "<table><tr><th>student</th><th>stage</th><th>was</th><th>now</th>"
            "<th>score</th><th>suspected bug</th><th>worst error (× tolerance)</th>"
            "<th>cases added (-removed)</th><th>what differs</th></tr>"
            f"{rows}</table></section>")


SIMILARITY_STYLE = ("pre.code{font-size:11px;white-space:pre-wrap;max-height:30em;overflow:auto;"
                    "background:#fafafa;border:1px solid #ddd;padding:.4em;margin:0}"
                    "mark{background:#ffd27a}td.side{vertical-align:top;width:50%}")


def similarity_section(pairs: list[Pair], threshold: float) -> str:
    """Pairs at or above the threshold, each with the shared code side by side."""
    head = (f"<section id=similarity><h2>Similar code (template subtracted)</h2>"
            f"<style>{SIMILARITY_STYLE}</style><p>Pairs whose own code is at least "
            f"{threshold:.0%} alike (the larger of the two shares), compared by copydetect "
            "with the provided template removed; identifiers are normalised, so renaming does "
            "not hide a copy. A lead to read, never a verdict; no score changes.</p>")
    if not pairs:
        return head + "<p>No pair reached the threshold.</p></section>"
    parts = [head]
    for p in pairs:
        parts.append(
            f"<h3 class=pair>{escape(p.a)} and {escape(p.b)}: {p.similarity:.0%} "
            f"({p.share_a:.0%} of {escape(p.a)}'s own code, {p.share_b:.0%} of "
            f"{escape(p.b)}'s)</h3>")
        for f in p.fragments:
            parts.append(
                f"<table class=side-by-side><tr><th>{escape(p.a)}: {escape(f.path)}</th>"
                f"<th>{escape(p.b)}: {escape(f.path)}</th></tr><tr>"
                f"<td class=side><pre class=code>{f.left}</pre></td>"
                f"<td class=side><pre class=code>{f.right}</pre></td></tr></table>")
    return "\n".join(parts) + "</section>"
