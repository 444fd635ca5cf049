"""What a tool call answers: the tool definitions `tools/list` hands out, a data call's page shaped for a model and
cut to fit MCP_MAX_RESULT_BYTES, and errors a model can act on (`isError` with a sentence saying what to do).
Provider text only ever sits in data fields; every sentence here is the gateway's own.
"""

import functools
from dataclasses import dataclass

import orjson

from handlers.mcp.tools import CURSOR_MAX, TOOLS, Tool
from social.compact import SHAPES, cut, fit, writable
from social.endpoints import Endpoint

__all__ = ["CURSOR_MAX", "definitions", "failure", "page", "provider_error", "refused", "structured", "success"]

# Also `next_cursor`, `returned` and `truncated` (a page cut to fit): left out of the schema, which every agent pays
# for in context with every tool.
_PAGE_OUTPUT = {"type": "object", "properties": {"items": {"type": "array"}}, "required": ["items"]}
_OUTPUT = {
    "estimate_cost": {
        "type": "object",
        "properties": {"most_credits": {"type": "integer"}, "cache_likely": {"type": "boolean"}},
        "required": ["most_credits", "cache_likely"],
    },
    "get_account": {"type": "object", "properties": {"balance": {"type": "integer"}}, "required": ["balance"]},
}


def _definition(tool: Tool) -> dict:
    return {
        "name": tool.name,
        "description": tool.description,
        "inputSchema": tool.input_schema(),
        "outputSchema": _OUTPUT.get(tool.name, _PAGE_OUTPUT),
        "annotations": {"readOnlyHint": True},
    }


@functools.cache
def definitions() -> list[dict]:
    return [_definition(tool) for tool in TOOLS]


@dataclass
class Page:
    items: list
    returned: int
    truncated: bool
    next_cursor: str | None  # the provider's, for the next page
    position: int = 0  # items of the provider's page handed out so far, these included
    last_id: str | None = None  # the id of the last of them


def page(
    body: bytes, endpoint: Endpoint, shape: str, fields, skip: int, after: str | None, max_bytes: int, meta: dict
) -> Page | None:
    """A provider answer as compact items, past those already handed out (the first `skip`, the last of them the
    item `after`: when the page read again has changed, what follows that item), cut at whole items so that the
    whole result (`success` with this `meta`) is at most `max_bytes`; None for an error body (the provider's own
    error, not charged). An item too large on its own is handed out shortened (social/compact.py `cut`), so a
    continued page always moves on."""
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(data, dict) or data.get("status") == "error":
        return None
    raw = data.get(endpoint.results)
    if endpoint.results == "data" or isinstance(raw, dict):
        raw = [raw] if raw else []
    if not isinstance(raw, list):
        raw = []
    ids = [_id_of(item) for item in raw]
    if after is not None and after in ids:  # new items on top, or some gone: go on after the last one handed out
        skip = ids.index(after) + 1
    items = [writable(SHAPES[shape](item, fields)) for item in raw[skip:]]
    nxt = data.get("next_cursor") if data.get("has_next_page", True) else None
    nxt = str(nxt) if nxt not in (None, "", 0, "0") else None
    room = max_bytes - _envelope(nxt, meta)
    kept = fit(items, room, _both_copies)
    if not kept and items:
        kept = [cut(items[0], room, _both_copies)]
    position = skip + len(kept)
    return Page(kept, len(kept), len(kept) < len(items), nxt, position, ids[position - 1] if kept else None)


def _id_of(item) -> str | None:
    """A provider item's id (an id list's items are ids)."""
    found = item.get("id") if isinstance(item, dict) else item
    return None if found is None or isinstance(found, dict | list) else str(found)


def _both_copies(item) -> int:
    """An item's bytes in a result: in `structuredContent`, and again in the text copy, where its JSON is a string
    (every quotation mark and backslash escaped once more), each with its comma."""
    encoded = orjson.dumps(item)
    return len(encoded) + len(orjson.dumps(encoded.decode())) - 2 + 2


def _envelope(nxt: str | None, meta: dict) -> int:
    """The bytes of a result around its items: `_meta`, the counts and the longest cursor it may hand out (the
    provider's, or a handle of `mcp:` and 32 hex digits)."""
    handle = "m" * 36
    cursor = nxt if nxt is not None and len(handle) < len(nxt) <= CURSOR_MAX else handle
    return len(orjson.dumps(success(Page([], 10**6, False, None), cursor, meta)))


def success(found: Page, next_cursor: str | None, meta: dict) -> dict:
    content = {
        "items": found.items,
        "returned": found.returned,
        "truncated": found.truncated,
        "next_cursor": next_cursor,
    }
    return {**structured(content), "_meta": meta}


def structured(content: dict) -> dict:
    return {"content": [{"type": "text", "text": orjson.dumps(content).decode()}], "structuredContent": content}


def failure(sentence: str, meta: dict | None = None) -> dict:
    answer = {"content": [{"type": "text", "text": sentence}], "isError": True}
    if meta:
        answer["_meta"] = meta
    return answer


def provider_error(body: bytes) -> str:
    """A provider's answer of an error in a successful reply ("user not found"), as a sentence: what it said (cut
    short) and what to do."""
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        data = None
    said = str(data.get("msg") or data.get("message") or "") if isinstance(data, dict) else ""
    what = f": {_short(said)}" if said else " with an error"
    return f"The data provider answered{what}. Check the arguments (ids, handle) before calling again; nothing was charged."


def refused(status: int, body: bytes, headers: dict, meta: dict) -> dict:
    """A data call that did not answer 200, as a sentence: what happened and what to do."""
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        data = {}
    detail = data.get("detail") if isinstance(data, dict) else None
    if isinstance(detail, list):  # 422: which argument, what is wrong
        said = "; ".join(map(_problem, detail))
        return failure(f"Invalid arguments: {_short(said)}. Fix them and call again.", meta)
    said = str(data.get("msg") or data.get("message") or detail or "") if isinstance(data, dict) else ""
    said = _short(said)  # a provider's refusal is passed through: its message may be any length
    if status == 402:
        if "credit_limit" in said:  # the key's budget (handlers/social.py budget_message) says what to change
            return failure(f"Not enough credits: {said}; nothing was charged.", meta)
        return failure(f"Not enough credits: {said}. Ask the account's owner to top up; nothing was charged.", meta)
    if status == 429:
        wait = headers.get("Retry-After", "1")
        return failure(f"Rate limited: {said}. Wait {wait} seconds, then call again.", meta)
    if status in (401, 403):
        return failure(f"Refused: {said}. The API key must be fixed in the client's configuration.", meta)
    if status >= 500:
        wait = headers.get("Retry-After", "5")
        return failure(f"{said or 'The gateway failed'}. Wait {wait} seconds and call again.", meta)
    return failure(f"The provider refused this call ({status}): {said or 'no details'}. Nothing was charged.", meta)


def _short(said: str, most: int = 300) -> str:
    """A message quoted in a sentence, at most `most` characters: a result stays within MCP_MAX_RESULT_BYTES."""
    return said if len(said) <= most else said[:most] + "…"


def _problem(found) -> str:
    """One entry of a 422's `detail` ({"loc": ["query", name], "msg": ...}), or whatever a provider put there."""
    if not isinstance(found, dict):
        return str(found)
    where = found.get("loc")
    where = ".".join(map(str, where[1:])) if isinstance(where, list) else ""
    return f"{where}: {found.get('msg')}"
