"""The course in a notebook (Jupyter, JupyterLab, VS Code, Colab): `%load_ext theinference`,
then `check("STAGE")` in a cell (or a `%%check STAGE` cell, or `%check STAGE`) grades the
functions as the kernel defines them now, as `theinference test` does, and shows the report
inline. `configure(weights="gpt2")` changes what every later check grades with.

Which cells' code is graded: theinference/course/notebook.py (docs/notebooks.md).
"""

from theinference.notebook.kernel import Checked, KernelCourse

__all__ = ["Checked", "check", "configure", "load_ipython_extension"]

_courses: dict[int, KernelCourse] = {}  # one per IPython shell


def load_ipython_extension(ipython) -> None:
    """`%load_ext theinference`: the kernel's course, `check` and `configure` in its
    namespace, the `%check` / `%%check` magic, and the weights `load_weights()` reads."""
    course = _course(ipython)
    course.point_weights()

    def check_magic(line: str, cell: str | None = None) -> Checked:
        if cell and cell.strip():
            ipython.ex(cell)  # the cell's own code first: it defines what is checked
        return course.check(*line.split())

    ipython.register_magic_function(check_magic, "line_cell", "check")
    ipython.push({"check": course.check, "configure": course.configure})


def _course(ipython) -> KernelCourse:
    if id(ipython) not in _courses:
        _courses[id(ipython)] = KernelCourse(lambda: _history(ipython))
    return _courses[id(ipython)]


def _history(ipython) -> list[tuple[str, str]]:
    """The kernel's cells as they ran (this one included), as typed: magics and all."""
    raw = ipython.history_manager.input_hist_raw
    return [(f"In [{n}]", source) for n, source in enumerate(raw) if n and source]


def _shell():
    try:
        from IPython import get_ipython
    except ImportError:
        get_ipython = None
    shell = get_ipython() if get_ipython else None
    if shell is None:
        raise RuntimeError("check() grades a notebook kernel's functions; in a course "
                           "directory run `theinference test` instead")
    return shell


def check(*stages: str, **settings) -> Checked:
    """Grade the stages named (none: every stage) on the kernel's cells as they are now."""
    return _course(_shell()).check(*stages, **settings)


def configure(**settings):
    """Change how later checks grade: weights, sandbox, timeout, quick, first_failure."""
    return _course(_shell()).configure(**settings)
