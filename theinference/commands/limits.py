"""Checks for the numbers options take: a limit or a count that makes no sense (a timeout at or
below zero, no memory, no jobs, a negative seed, NaN or infinity) is a usage error that names
the option (exit 2), before anything runs. Each is an option callback:
`typer.Option(callback=positive)`.
"""

import math

import typer

MAX_BYTES = 1 << 62  # a memory or output cap in bytes must fit the kernel's limit type


def positive(value: float | None) -> float | None:
    """A number of seconds, GiB or KiB: finite and above zero."""
    if value is not None and not (math.isfinite(value) and value > 0):
        raise typer.BadParameter(f"must be a number above 0, not {value:g}")
    return value


def gibibytes(value: float | None) -> float | None:
    """A memory cap in GiB: above zero, and small enough to be a byte count."""
    if positive(value) is not None and value * 2**30 >= MAX_BYTES:
        raise typer.BadParameter(f"{value:g} GiB is more than any machine can cap")
    return value


def kibibytes(value: int | None) -> int | None:
    """An output cap in KiB: a whole number above zero, small enough to be a byte count."""
    if value is not None and not 0 < value < MAX_BYTES >> 10:
        raise typer.BadParameter(f"must be a whole number of KiB above 0, not {value}")
    return value


def at_least_one(value: int | None) -> int | None:
    """A count of things to run at once: one or more."""
    if value is not None and value < 1:
        raise typer.BadParameter(f"must be at least 1, not {value}")
    return value


def size(value: str | None) -> str | None:
    """A memory size: `10G`, `10240M`, `10Gi` or bytes, above zero."""
    from theinference.grading.allocation import parse_size

    if value is not None:
        try:
            if parse_size(value) >= MAX_BYTES:
                raise ValueError(f"{value} is more than any machine has")
        except ValueError as exc:
            raise typer.BadParameter(str(exc)) from None
    return value


def seed(value: int | None) -> int | None:
    """A seed for the hidden cases: a whole number, zero or more."""
    if value is not None and value < 0:
        raise typer.BadParameter(f"must be a whole number >= 0, not {value}")
    return value
