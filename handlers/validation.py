"""Validation in the spec's 422 shape: {"detail": [{"loc", "msg", "type"}]}.

A portal body or query parameter is declared once as a `Field` whose limits are data
(minimum, maximum, max_length, enum, ...): the handler validates from it and
handlers/openapi_schema.py documents it from the same declaration. Messages and types follow
the wording users know from the reference API.
"""

import re
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from handlers.errors import ValidationError, error, missing

INT_DIGITS = 18  # integers are read with at most this many digits: int64-safe, whatever the field's bounds
INT_MAX = 10**INT_DIGITS - 1
_INT = re.compile(rf"[+-]?[0-9]{{1,{INT_DIGITS}}}")


def parse_int(raw: str, loc: list, minimum: int | None = None, maximum: int | None = None) -> int:
    if not _INT.fullmatch(raw.strip()):
        raise ValidationError(
            [error(loc, "Input should be a valid integer, unable to parse string as an integer", "int_parsing")]
        )
    value = int(raw)
    check_range(value, loc, minimum, maximum)
    return value


def check_range(value: int | float, loc: list, minimum=None, maximum=None, exclusive_minimum=None) -> None:
    if exclusive_minimum is not None and value <= exclusive_minimum:
        raise ValidationError([error(loc, f"Input should be greater than {exclusive_minimum}", "greater_than")])
    if minimum is not None and value < minimum:
        raise ValidationError([error(loc, f"Input should be greater than or equal to {minimum}", "greater_than_equal")])
    if maximum is not None and value > maximum:
        raise ValidationError([error(loc, f"Input should be less than or equal to {maximum}", "less_than_equal")])


def check_length(value: str, loc: list, minimum: int | None, maximum: int | None) -> None:
    if minimum is not None and len(value) < minimum:
        raise ValidationError([error(loc, f"String should have at least {minimum} characters", "string_too_short")])
    if maximum is not None and len(value) > maximum:
        raise ValidationError([error(loc, f"String should have at most {maximum} characters", "string_too_long")])


def length(minimum: int, maximum: int) -> Callable[[str, list], None]:
    return lambda value, loc: check_length(value, loc, minimum, maximum)


_TRUE, _FALSE = {"true", "1"}, {"false", "0"}
_BOOL = _TRUE | _FALSE


def no_controls(value: str, loc: list) -> None:
    # A name is shown in lists, logs and CSV exports: NUL, line breaks and other control characters have no place.
    if any(unicodedata.category(c) == "Cc" for c in value):
        raise ValidationError([error(loc, "Input should not contain control characters", "string_pattern_mismatch")])


no_controls.pattern = r"^[^\u0000-\u001F\u007F-\u009F]*$"  # the same rule, for OpenAPI (openapi_schema.py)


def one_of(choices: tuple) -> Callable:
    def check(value: str, loc: list) -> None:
        if value not in choices:
            expected = ", ".join(f"'{c}'" for c in choices)
            raise ValidationError([error(loc, f"Input should be {expected}", "enum")])

    return check


def parse_bool(raw: str, loc: list) -> bool:
    value = raw.strip().lower()
    if value in _BOOL:
        return value in _TRUE
    raise ValidationError([error(loc, "Input should be a valid boolean, unable to interpret input", "bool_parsing")])


_EMAIL = re.compile(
    r"^[A-Za-z0-9.!#$%&'*+/=?^_`{|}~-]+@[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)+$"
)
# RFC 3339 date-time, the JSON Schema format (a field with it also checks the calendar: see its `check`).
_DATE_TIME = re.compile(
    r"^[0-9]{4}-[0-9]{2}-[0-9]{2}[Tt ][0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]{1,6})?([Zz]|[+-][0-9]{2}:[0-9]{2})$"
)
FORMATS = {
    "email": (_EMAIL, "value is not a valid email address"),
    "date-time": (_DATE_TIME, "Input should be a valid ISO 8601 datetime"),
    # RFC 3339 full-date (its calendar checked as date-time's is)
    "date": (re.compile(r"^[0-9]{4}-[0-9]{2}-[0-9]{2}$"), "Input should be a valid date (YYYY-MM-DD)"),
}


@dataclass(frozen=True)
class Field:
    """One property of a JSON body, or one query parameter, with its limits as data."""

    name: str
    kind: type  # str, int, float, bool or dict
    required: bool = True
    default: Any = None  # query parameters: the value when the parameter is absent
    minimum: int | float | None = None
    exclusive_minimum: int | float | None = None
    maximum: int | float | None = None
    min_length: int | None = None
    max_length: int | None = None
    enum: tuple[str, ...] = ()  # declared in capitals, matched without regard to case
    format: str | None = None  # a key of FORMATS
    description: str = ""
    # A rule no schema keyword states (a password's variety, no operators in a stored object); runs last.
    check: Callable[[Any, list], None] | None = None


def check_value(f: Field, value: Any, loc: list) -> None:
    """Raises ValidationError for the first limit of `f` that a value of the right type breaks."""
    if f.enum and value.upper() not in f.enum:
        raise ValidationError([error(loc, f"Input should be one of {', '.join(f.enum)}", "enum")])
    if f.format and not FORMATS[f.format][0].fullmatch(value):
        raise ValidationError([error(loc, FORMATS[f.format][1], "value_error")])
    if f.kind is str:
        check_length(value, loc, f.min_length, f.max_length)
    if f.kind in (int, float):
        check_range(value, loc, f.minimum, f.maximum, f.exclusive_minimum)
    if f.check:
        f.check(value, loc)


_TYPE_NAMES = {
    str: ("string", "string_type"),
    int: ("integer", "int_type"),
    bool: ("boolean", "bool_type"),
    float: ("number", "float_type"),
    dict: ("object", "dict_type"),
    list: ("list", "list_type"),
}


def validate_body(data: Any, fields: list[Field]) -> dict:
    """Checks a decoded JSON body against `fields`: types, presence, limits, no unknown properties."""
    if not isinstance(data, dict):
        raise ValidationError([error(["body"], "Input should be a valid dictionary or object", "dict_type")])
    errors, out = [], {}
    known = {f.name for f in fields}
    for name in data:
        if name not in known:
            errors.append(error(["body", name], "Extra inputs are not permitted", "extra_forbidden"))
    for f in fields:
        loc = ["body", f.name]
        if f.name not in data or data[f.name] is None:
            if f.required:
                errors.append(missing(loc))
            continue
        value = data[f.name]
        # bool is an int in Python; JSON true is not a valid integer here.
        ok = isinstance(value, f.kind) and not (f.kind in (int, float) and isinstance(value, bool))
        if f.kind is float and isinstance(value, int) and not isinstance(value, bool):
            ok, value = True, float(value)
        # JSON has one number type: 5.0 is a valid JSON Schema integer, as the OpenAPI document promises.
        if f.kind is int and isinstance(value, float) and value.is_integer() and abs(value) < 2**53:
            ok, value = True, int(value)
        if not ok:
            label, type_ = _TYPE_NAMES[f.kind]
            errors.append(error(loc, f"Input should be a valid {label}", type_))
            continue
        try:
            check_value(f, value, loc)
            out[f.name] = value
        except ValidationError as exc:
            errors.extend(exc.errors)
    if errors:
        raise ValidationError(errors)
    return out


def parse_query(f: Field, raw: str | None) -> Any:
    """A query parameter's value from its text (None when absent: the declared default)."""
    if raw is None:
        return f.default
    loc = ["query", f.name]
    if f.kind is int:
        return parse_int(raw, loc, f.minimum, f.maximum)
    if f.kind is bool:
        return parse_bool(raw, loc)
    check_value(f, raw, loc)
    return raw


def no_operators(value: dict, loc: list, depth: int = 0) -> None:
    """Free-form objects are stored as given: refuse `$` and `.` keys and deep nesting (no operator injection)."""
    if depth > 5:
        raise ValidationError([error(loc, "Object is nested too deeply", "value_error")])
    for key, item in value.items():
        if key.startswith("$") or "." in key:
            raise ValidationError([error(loc + [key], "Keys may not start with $ or contain a dot", "value_error")])
        if isinstance(item, dict):
            no_operators(item, loc + [key], depth + 1)
