"""Validation in the spec's 422 shape: {"detail": [{"loc", "msg", "type"}]}.

Messages and types follow the wording users know from the reference API.
"""

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


class ValidationError(Exception):
    def __init__(self, errors: list[dict]):
        super().__init__("validation failed")
        self.errors = errors


def error(loc: list, msg: str, type_: str) -> dict:
    return {"loc": loc, "msg": msg, "type": type_}


def missing(loc: list) -> dict:
    return error(loc, "Field required", "missing")


def parse_int(raw: str, loc: list, minimum: int | None = None, maximum: int | None = None) -> int:
    if not re.fullmatch(r"[+-]?\d{1,18}", raw.strip()):
        raise ValidationError(
            [error(loc, "Input should be a valid integer, unable to parse string as an integer", "int_parsing")]
        )
    value = int(raw)
    check_range(value, loc, minimum, maximum)
    return value


def check_range(value: int | float, loc: list, minimum=None, maximum=None) -> None:
    if minimum is not None and value < minimum:
        raise ValidationError([error(loc, f"Input should be greater than or equal to {minimum}", "greater_than_equal")])
    if maximum is not None and value > maximum:
        raise ValidationError([error(loc, f"Input should be less than or equal to {maximum}", "less_than_equal")])


_TRUE, _FALSE = {"true", "1"}, {"false", "0"}


def parse_bool(raw: str, loc: list) -> bool:
    value = raw.strip().lower()
    if value in _TRUE | _FALSE:
        return value in _TRUE
    raise ValidationError([error(loc, "Input should be a valid boolean, unable to interpret input", "bool_parsing")])


@dataclass(frozen=True)
class Field:
    """One property of a JSON body."""

    name: str
    kind: type
    required: bool = True
    check: Callable[[Any, list], None] | None = None


_TYPE_NAMES = {
    str: ("string", "string_type"),
    int: ("integer", "int_type"),
    bool: ("boolean", "bool_type"),
    float: ("number", "float_type"),
    dict: ("object", "dict_type"),
    list: ("list", "list_type"),
}


def validate_body(data: Any, fields: list[Field]) -> dict:
    """Checks a decoded JSON body against `fields`: types, presence, no unknown properties."""
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
            if f.check:
                f.check(value, loc)
            out[f.name] = value
        except ValidationError as exc:
            errors.extend(exc.errors)
    if errors:
        raise ValidationError(errors)
    return out


def length(minimum: int, maximum: int) -> Callable[[str, list], None]:
    def check(value: str, loc: list) -> None:
        if len(value) < minimum:
            raise ValidationError([error(loc, f"String should have at least {minimum} characters", "string_too_short")])
        if len(value) > maximum:
            raise ValidationError([error(loc, f"String should have at most {maximum} characters", "string_too_long")])

    return check


def no_operators(value: dict, loc: list, depth: int = 0) -> None:
    """Free-form objects are stored as given: refuse `$` and `.` keys and deep nesting (no operator injection)."""
    if depth > 5:
        raise ValidationError([error(loc, "Object is nested too deeply", "value_error")])
    for key, item in value.items():
        if key.startswith("$") or "." in key:
            raise ValidationError([error(loc + [key], "Keys may not start with $ or contain a dot", "value_error")])
        if isinstance(item, dict):
            no_operators(item, loc + [key], depth + 1)
