"""A multi-turn chat for ``edgesdk run``'s interactive mode: each turn renders the whole conversation
through the chat template, as a chat client does with ``messages``.

With a :class:`~edgesdk.runtime.prompt_cache.PromptCache` the earlier turns are not prefilled
again: their tokens are already in the KV cache. When the conversation, plus room for the answer,
outgrows the bundle's context, the oldest exchanges are left out (the system message stays),
as Ollama truncates a chat from its start.
"""

from __future__ import annotations

from collections.abc import Callable

from edgesdk.runtime.text import ChatTokenizer, check_utf8


def fit_to_context(history, ids_of: Callable[[list], list[int]]) -> list[int]:
    """The prompt's token ids, ``ids_of(kept)``, for the longest tail ``kept`` of ``history.exchanges`` whose ids and
    ``history.answer_room`` tokens fit ``history.max_context`` (none kept, where even the last does not). Where
    generation takes the ids (they fit the context), the exchanges left out go for good, counted in
    ``history.dropped``; a prompt too long on its own drops nothing (generation refuses it by name). Shared by
    :class:`Conversation` and the plain-text transcript (``edgesdk.cli_interactive.Transcript``)."""
    kept = history.exchanges
    while True:
        ids = ids_of(kept)
        if len(ids) + history.answer_room <= history.max_context or not kept:
            break
        kept = kept[1:]
    if len(ids) <= history.max_context:
        history.dropped += len(history.exchanges) - len(kept)
        history.exchanges = list(kept)
    return ids


class Conversation:
    """The system message and the (user, assistant) exchanges so far."""

    def __init__(self, tokenizer: ChatTokenizer, system: str | None, max_context: int, answer_room: int):
        if system is not None:
            check_utf8(system, "--system")
        self.tokenizer, self.system = tokenizer, system
        # Room kept for the answer: at most half the context, so a large -n does not crowd out the whole
        # history (an answer that runs out of context stops there, as any answer does).
        self.max_context, self.answer_room = max_context, min(answer_room, max_context // 2)
        self.exchanges: list[tuple[str, str]] = []
        self.dropped = 0  # exchanges left out so far to fit the context

    def _messages(self, user_text: str, exchanges: list[tuple[str, str]]) -> list[dict]:
        messages = [] if self.system is None else [{"role": "system", "content": self.system}]
        for user, assistant in exchanges:
            messages += [{"role": "user", "content": user}, {"role": "assistant", "content": assistant}]
        return messages + [{"role": "user", "content": user_text}]

    def prompt_ids(self, user_text: str) -> list[int]:
        """The token ids of the conversation with ``user_text`` as its next turn. The oldest exchanges
        are dropped (for good) while the prompt and ``answer_room`` tokens do not fit the context; a
        single turn too long on its own is left to generation, which refuses it by name, and then
        drops nothing: the conversation goes on after the refused line as it was before it."""
        check_utf8(user_text, "the prompt")
        return fit_to_context(self, lambda kept: self.tokenizer.chat_ids(
            self.tokenizer.render_chat(self._messages(user_text, kept))))

    def answered(self, user_text: str, answer_text: str) -> None:
        """Record an exchange (an answer cut short keeps the text it had written)."""
        self.exchanges.append((user_text, answer_text))

    def take_last(self) -> str | None:
        """Drop the last exchange and return its user text, to be answered again (``/regen``, as llama-cli's
        tools/cli erases the last message and generates it again); None when there is no exchange."""
        if not self.exchanges:
            return None
        user_text, _ = self.exchanges.pop()
        return user_text

    def clear(self) -> None:
        self.exchanges = []
