"""What a client builds from a streamed chat answer's deltas."""

from __future__ import annotations


def accumulated_message(deltas: list[dict]) -> dict:
    """The message a client builds by joining the deltas' strings (content, each call's arguments by index)."""
    message: dict = {"role": None, "content": None}
    for delta in deltas:
        if "role" in delta:
            message["role"] = delta["role"]
        if delta.get("content") is not None:
            message["content"] = (message["content"] or "") + delta["content"]
        for piece in delta.get("tool_calls") or []:
            calls = message.setdefault("tool_calls", [])
            if piece["index"] == len(calls):
                calls.append({"id": piece["id"], "type": piece["type"],
                              "function": {"name": piece["function"]["name"], "arguments": ""}})
            calls[piece["index"]]["function"]["arguments"] += piece["function"].get("arguments", "")
    return message
