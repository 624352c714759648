"""Stored JSON read back without trusting it: every field checked for its kind as it is taken,
so that a damaged, forged or foreign file is refused with a message that says where and what,
never a traceback from deep inside whatever would have used the field.

The results reader (json_form.py) and the classroom's record reader (classroom/records.py)
take their fields through `Fields`; nothing else reads a stored run's JSON."""

from collections.abc import Callable
from dataclasses import dataclass

MISSING = object()  # a field with no default: its absence is an error


class ResultsError(ValueError):
    """Stored results that are not what the grader writes; the message says where and why."""


@dataclass(frozen=True)
class Kind:
    """What a field may hold: `name` says it in an error message."""

    name: str
    fits: Callable[[object], bool]


TEXT = Kind("a string", lambda v: isinstance(v, str))
FLAG = Kind("true or false", lambda v: isinstance(v, bool))
# bool is an int to Python, never a number to JSON
NUMBER = Kind("a number", lambda v: isinstance(v, int | float) and not isinstance(v, bool))
WHOLE = Kind("a whole number", lambda v: isinstance(v, int) and not isinstance(v, bool))
OBJECT = Kind("an object", lambda v: isinstance(v, dict))
LIST = Kind("a list", lambda v: isinstance(v, list))


def or_null(kind: Kind) -> Kind:
    return Kind(f"{kind.name} or null", lambda v: v is None or kind.fits(v))


def either(a: Kind, b: Kind) -> Kind:
    return Kind(f"{a.name} or {b.name}", lambda v: a.fits(v) or b.fits(v))


def list_of(kind: Kind) -> Kind:
    return Kind(f"a list, each {kind.name}",
                lambda v: isinstance(v, list) and all(kind.fits(x) for x in v))


def mapping_of(kind: Kind) -> Kind:
    return Kind(f"an object, each value {kind.name}",
                lambda v: isinstance(v, dict) and all(kind.fits(x) for x in v.values()))


def one_of(values: list[str]) -> Kind:
    return Kind(f"one of {', '.join(values)}", lambda v: isinstance(v, str) and v in values)


def kind_of(value: object) -> str:
    """The JSON kind of a value, for an error message (never the value: it may be anyone's)."""
    kinds = (FLAG, NUMBER, TEXT, LIST, OBJECT)
    return "null" if value is None else next((k.name for k in kinds if k.fits(value)), "?")


class Fields:
    """One JSON object, its fields taken one by one, each checked; `where` names the object in
    errors (e.g. results.stages[2].cases[0])."""

    def __init__(self, data: object, where: str):
        if not isinstance(data, dict):
            raise ResultsError(f"{where} must be an object, not {kind_of(data)}")
        self.data, self.where = data, where

    def get(self, key: str, kind: Kind, default=MISSING):
        """The field, of `kind`; `default` when it is absent (absent without one: an error)."""
        if key not in self.data:
            if default is MISSING:
                raise ResultsError(f"{self.where}: {key} is missing")
            return default
        value = self.data[key]
        if not kind.fits(value):
            raise ResultsError(f"{self.where}: {key} must be {kind.name}, not {kind_of(value)}")
        return value

    def object(self, key: str) -> "Fields":
        return Fields(self.get(key, OBJECT), f"{self.where}.{key}")

    def objects(self, key: str) -> list["Fields"]:
        """A list of objects, each read on its own."""
        items = self.get(key, LIST)
        return [Fields(item, f"{self.where}.{key}[{i}]") for i, item in enumerate(items)]
