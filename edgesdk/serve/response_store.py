"""The responses ``POST /v1/responses`` keeps for ``previous_response_id``, ``item_reference`` and the retrieve /
delete / ``input_items`` routes (edgesdk/serve/responses.py): a least-recently-used store, bounded by count and by
the bytes of kept JSON, behind a lock; a streamed response is kept ``in_progress`` from its first event until it
ends. Nothing survives a restart. Kept items are written in the openai client's types for their role, so
``input_items`` reads back as the client's list.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from dataclasses import dataclass

from edgesdk.serve.api import (
    ApiError,
    json_shown,
)
from edgesdk.serve.response_events import item_id

# OpenAI's API reference, "List input items": ``limit`` "can range between 1 and 100, and the default is 20"; ``order``
# "Default is desc"
ITEMS_LIMIT, ITEMS_MAX = 20, 100


def kept_items(value: object) -> list[dict]:
    """``input`` (already checked) as the items a kept response lists, each with an id (the one it came with, else a
    new one) and the ``status`` it came with (else "completed": a call or message an answer cut by its token limit,
    or a call cut by the request's stop string, gave, sent back "incomplete", is listed so, as its ``item_reference`` and the response that gave it show it): a
    string is one user message; a message's content is kept as :func:`_kept_parts` gives it (a string
    as one part, which the prompt reads as the string: :func:`join_text_parts` of one text)."""
    if isinstance(value, str):
        value = [{"role": "user", "content": value}]
    items = []
    for item in value:
        kind = item.get("type", "message")
        # the status an item came with (a cut answer's item sent back is "incomplete"), else "completed"
        status = item.get("status") or "completed"
        if kind == "message":
            item = {"type": "message", "role": item["role"], "content": _kept_parts(item["role"], item["content"]),
                    "status": status, "id": item.get("id") or item_id("msg")}
        elif kind == "function_call":
            item = {"type": "function_call", "call_id": item["call_id"], "name": item["name"],
                    "arguments": item["arguments"], "status": status, "id": item.get("id") or item_id("fc")}
        elif kind == "function_call_output":
            output = item["output"] if isinstance(item["output"], str) else _kept_parts("tool", item["output"])
            item = {"type": "function_call_output", "call_id": item["call_id"], "output": output,
                    "status": status, "id": item.get("id") or item_id("fco")}
        else:  # reasoning: left out of the prompt, kept with the fields the client's ResponseReasoningItem reads
            item = {"type": "reasoning", "summary": item.get("summary") or [],
                    **{field: item[field] for field in ("content", "encrypted_content", "status")
                       if item.get(field) is not None},
                    "id": item.get("id") or item_id("rs")}
        items.append(item)
    return items


def _kept_parts(role: str, content: str | list) -> list[dict]:
    """A message's content (already checked) as its kept item lists it, in the parts the openai client reads for
    its role (``ResponseOutputMessage`` for an assistant's, ``ResponseInputMessageItem`` for the others'): an
    assistant's text as ``output_text`` parts (with the annotations and logprobs they came with) or its ``refusal``
    parts, another role's as ``input_text`` parts, whichever of the two text parts the request sent; the text the
    prompt reads is the same."""
    parts = [{"type": "output_text", "text": content}] if isinstance(content, str) else content
    if role != "assistant":
        return [{"type": "input_text", "text": part["refusal" if part["type"] == "refusal" else "text"]}
                for part in parts]
    kept = []
    for part in parts:
        if part["type"] == "refusal":
            kept.append({"type": "refusal", "refusal": part["refusal"]})
            continue
        given = {field: part[field] for field in ("annotations", "logprobs") if isinstance(part.get(field), list)}
        kept.append({"type": "output_text", "text": part["text"], "annotations": [], **given})
    return kept


def _json_size(value: object) -> int:
    """The bytes of ``value`` as the server writes it (UTF-8 JSON; a lone surrogate counted as its 3 bytes)."""
    return len(json.dumps(value, ensure_ascii=False).encode("utf-8", "surrogatepass"))


@dataclass(frozen=True)
class Kept:
    """A kept response: the response object as it was answered, and the input items that led to it."""

    response: dict
    items: tuple
    size: int  # bytes of both as JSON


def _kept(response: dict, items: tuple) -> Kept:
    return Kept(response, tuple(items), _json_size(response) + _json_size(list(items)))


class ResponseStore:
    """The responses ``store`` keeps, in this process's memory (nothing survives a restart), for
    ``previous_response_id`` and the ``/v1/responses/{id}`` routes: at most ``count`` responses and ``size`` bytes of
    their JSON with their input items (each response keeps its whole conversation's items, so a long chain's later
    responses are the larger); past either limit the least recently used go first, and a response larger than
    ``size`` alone is not kept. A streamed response is kept from its start (:meth:`begin`, ``in_progress``) and
    replaced by the finished one (:meth:`finish`), unless it was deleted meanwhile; one that does not finish is
    forgotten (:meth:`abandon`). Requests on the server's threads share it: a lock guards it."""

    def __init__(self, count: int, size: int):
        self.count, self.size = count, size
        self._kept: OrderedDict[str, Kept] = OrderedDict()
        self._bytes = 0
        self._streaming: set[str] = set()  # streamed responses begun, not finished, not deleted
        self._lock = threading.Lock()

    def description(self) -> str:
        if self.count == 0:
            return "no responses (its limit is 0)"
        return f"the last {self.count} responses (within {self.size:,} bytes)"

    def put(self, response: dict, items: tuple) -> bool:
        """Keep ``response`` (its ``id``) with its input items; False where it is larger than the store."""
        kept = _kept(response, items)
        with self._lock:
            return self._put(kept)

    def begin(self, response: dict, items: tuple) -> None:
        """Keep a streamed response as it begins (``in_progress``), until :meth:`finish` or :meth:`abandon`."""
        kept = _kept(response, items)
        with self._lock:
            self._streaming.add(response["id"])
            self._put(kept)

    def finish(self, response: dict, items: tuple) -> None:
        """Keep a streamed response as it ended in place of its beginning, unless it was deleted meanwhile."""
        kept = _kept(response, items)
        with self._lock:
            if response["id"] in self._streaming:
                self._streaming.discard(response["id"])
                self._put(kept)

    def abandon(self, ident: str) -> None:
        """Forget a streamed response that did not finish (an error, its client gone)."""
        with self._lock:
            self._streaming.discard(ident)
            kept = self._kept.get(ident)
            if kept is not None and kept.response["status"] == "in_progress":
                self._bytes -= self._kept.pop(ident).size

    def _put(self, kept: Kept) -> bool:
        """:meth:`put` under the lock."""
        ident = kept.response["id"]
        old = self._kept.pop(ident, None)
        if old is not None:
            self._bytes -= old.size
        if self.count == 0 or kept.size > self.size:
            return False
        while self._kept and (len(self._kept) >= self.count or self._bytes + kept.size > self.size):
            self._bytes -= self._kept.popitem(last=False)[1].size
        self._kept[ident] = kept
        self._bytes += kept.size
        return True

    def get(self, ident: str) -> Kept | None:
        """The kept response ``ident`` (now the most recently used), or None."""
        with self._lock:
            kept = self._kept.get(ident)
            if kept is not None:
                self._kept.move_to_end(ident)
            return kept

    def delete(self, ident: str) -> bool:
        with self._lock:
            self._streaming.discard(ident)  # a stream still running: its end is not kept either
            kept = self._kept.pop(ident, None)
            if kept is not None:
                self._bytes -= kept.size
            return kept is not None

    def item(self, ident: str) -> dict | None:
        """The kept item ``ident`` names (``item_reference``): an output item or an input item of a kept response,
        the most recently used response's first; None where none is kept."""
        with self._lock:
            for kept in reversed(self._kept.values()):
                for item in (*kept.response["output"], *kept.items):
                    if item.get("id") == ident:
                        return item
            return None

    def usage(self) -> tuple[int, int]:
        """(responses kept, their bytes)."""
        with self._lock:
            return len(self._kept), self._bytes

    def ids(self) -> list[str]:
        """The kept responses' ids, least recently used first."""
        with self._lock:
            return list(self._kept)


def not_found(ident: str) -> ApiError:
    """A response id not kept, in OpenAI's words (``GET`` / ``DELETE /v1/responses/{id}``), with why and the fix."""
    return ApiError(404, f"Response with id '{ident}' not found. This server keeps finished responses made with "
                    "'store' true (the default) in memory, the most recent ones within its limits, until it restarts "
                    "or they are deleted; create the response again", code="not_found")


def not_cancelled(kept: Kept) -> ApiError:
    """``POST /v1/responses/{id}/cancel`` of a kept response: OpenAI cancels only responses made with ``background``
    (API reference, "Cancel a response": "Only responses created with the background parameter set to true can be
    cancelled"), and this server makes none."""
    return ApiError(400, f"Response with id '{kept.response['id']}' cannot be cancelled: only responses created with "
                    "'background': true can be, and this server answers every response while its request waits; to "
                    "stop a response still streaming, close its connection (the answer stops at its next token)",
                    code="unsupported_parameter")


def retrieved(kept: Kept, query: dict[str, list[str]]) -> dict:
    """``GET /v1/responses/{id}``: the response as it was answered. ``stream=true`` (which replays a background
    response's events in OpenAI's API) is refused: no response here is made in the background; ``stream`` false is
    taken however a client spells it (``false``, ``0``, Python's ``False`` as ``requests`` writes a bool)."""
    if query.get("stream", ["false"])[-1].lower() not in ("", "false", "0"):
        raise ApiError(400, "'stream' = true replays a background response's events; this server answers no "
                       "background responses: retrieve the response without 'stream'", param="stream",
                       code="unsupported_parameter")
    return kept.response


def input_items_page(kept: Kept, query: dict[str, list[str]]) -> dict:
    """``GET /v1/responses/{id}/input_items``: the response's input items as OpenAI's list object, ``order`` ``desc``
    (the default: the last item first) or ``asc``, ``limit`` items (1-100, 20 by default) after the item ``after``
    names, ``has_more`` where more follow (OpenAI's API reference, "List input items"). ``before`` (the spec's "An
    item ID to list items before, used in pagination", which the openapi-generated clients send) gives the page of
    ``limit`` items just before the item it names, in the same order, ``has_more`` where more come before it."""
    order = query.get("order", ["desc"])[-1]
    if order not in ("asc", "desc"):
        raise ApiError(400, f"'order' must be \"asc\" or \"desc\", got {json_shown(order)}", param="order")
    given = query.get("limit", [str(ITEMS_LIMIT)])[-1]
    if not (given.isascii() and given.isdigit()) or not 1 <= int(given) <= ITEMS_MAX:  # not '²', which int() refuses
        raise ApiError(400, f"'limit' must be a whole number from 1 to {ITEMS_MAX}, got {json_shown(given)}",
                       param="limit")
    items = list(kept.items) if order == "asc" else list(reversed(kept.items))
    after, before = query.get("after", [None])[-1], query.get("before", [None])[-1]
    if after:
        items = items[_index(kept, items, after, "after") + 1:]
    if before:  # the page nearest the item it names
        items = items[:_index(kept, items, before, "before")]
        page = items[-int(given):]
    else:
        page = items[:int(given)]
    return {"object": "list", "data": page, "first_id": page[0]["id"] if page else None,
            "last_id": page[-1]["id"] if page else None, "has_more": len(items) > len(page)}


def _index(kept: Kept, items: list[dict], ident: str, cursor: str) -> int:
    """Where the item ``ident`` (the ``after`` or ``before`` cursor) stands in ``items``, or the 400 naming it."""
    ids = [item["id"] for item in items]
    if ident not in ids:
        listed = "last_id" if cursor == "after" else "first_id"
        past = " listed past the item 'after' names" if len(items) < len(kept.items) else ""
        raise ApiError(400, f"'{cursor}' = {json_shown(ident)} is no input item of response {kept.response['id']}{past}: "
                       f"give the id of an item a previous page listed (its {listed})", param=cursor)
    return ids.index(ident)


# ------------------------------------------------------------------------------------------ answers
