"""JSON Schema building blocks of the OpenAPI document, and the schema of a declared `Field`."""

from handlers.validation import Field


def ref(name: str) -> dict:
    return {"$ref": f"#/components/schemas/{name}"}


def nullable(schema: dict) -> dict:
    return {"anyOf": [schema, {"type": "null"}]}


def array(items: dict) -> dict:
    return {"type": "array", "items": items}


def obj(required: tuple = (), closed: bool = False, **properties) -> dict:
    schema = {"type": "object", "properties": properties}
    if required:
        schema["required"] = list(required)
    if closed:
        schema["additionalProperties"] = False
    return schema


S, I, N, B = {"type": "string"}, {"type": "integer"}, {"type": "number"}, {"type": "boolean"}
TIME = {"type": "string", "format": "date-time"}


def query(name: str, schema: dict, description: str = "", required: bool = False) -> dict:
    return {"name": name, "in": "query", "required": required, "schema": schema, "description": description}


_KINDS = {str: "string", int: "integer", float: "number", bool: "boolean", dict: "object", list: "array"}
_KEYWORDS = (
    ("minimum", "minimum"),
    ("exclusive_minimum", "exclusiveMinimum"),
    ("maximum", "maximum"),
    ("min_length", "minLength"),
    ("max_length", "maxLength"),
    ("format", "format"),
    ("default", "default"),
)


def field_schema(f: Field) -> dict:
    """The JSON Schema of one declared field: its type and every limit the validator applies."""
    schema = {"type": _KINDS[f.kind]}
    if f.enum:
        schema["enum"] = list(f.enum)
    schema.update({keyword: getattr(f, name) for name, keyword in _KEYWORDS if getattr(f, name) is not None})
    if getattr(f.check, "pattern", None):  # a check that is a pattern says so (no control characters)
        schema["pattern"] = f.check.pattern
    return schema


def body_schema(fields: list[Field]) -> dict:
    """A closed object; an optional property may also be null (the validator reads null as absent)."""
    properties = {}
    for f in fields:
        schema = field_schema(f) | ({"description": f.description} if f.description else {})
        properties[f.name] = schema if f.required else nullable(schema)
    return obj(tuple(f.name for f in fields if f.required), True, **properties)


def with_properties(schema: dict, **properties) -> dict:
    schema["properties"].update(properties)
    return schema


def query_param(f: Field) -> dict:
    return query(f.name, field_schema(f), f.description, f.required)


def path_param(name: str, schema: dict, description: str = "") -> dict:
    return {"name": name, "in": "path", "required": True, "schema": schema, "description": description}
