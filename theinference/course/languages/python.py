"""Python: the course as the seeds write it, run by the Python worker (worker.py)."""

from pathlib import Path

from theinference.course.languages.language import TEMPLATES, Language

PYTHON = Language(
    name="python",
    notebook=True,  # the kernel's definitions are the course's (notebook/)
    title="Python",
    template=TEMPLATES / "python",
    adapters=Path("tests/adapters.py"),
    kvcache=Path("src/kvcache.py"),
    source_suffixes=(".py",),
    worker="worker.py",
    runtime="python",
    guardable=True,
    calibration=(512, 768, 3072, 6),  # an MLP product over a prompt
)
