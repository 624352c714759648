"""theinference: a grader for a course on KV-cached GPT-2 inference."""

__version__ = "0.1.0"


def load_ipython_extension(ipython) -> None:
    """`%load_ext theinference` in a notebook (theinference/notebook/)."""
    from theinference.notebook import load_ipython_extension as load

    load(ipython)
