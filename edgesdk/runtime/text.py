"""Tokenizer, chat template and streaming detokenization, on the ``tokenizers`` library alone."""

from __future__ import annotations

from pathlib import Path

from edgesdk.errors import BundleError


class ChatTokenizer:
    """The bundle's tokenizer.json plus the model's chat template (Jinja, as transformers renders it)."""

    def __init__(self, tokenizer_path: Path, facts: dict, template_path: Path | None):
        from tokenizers import Tokenizer

        self.tokenizer = Tokenizer.from_file(str(tokenizer_path))
        self.eos_token_ids = set(facts.get("eos_token_ids", []))
        self.bos_token = facts.get("bos_token")
        self.eos_token = facts.get("eos_token")
        self.template_source = template_path.read_text(encoding="utf-8") if template_path else None
        self._template = None

    @property
    def has_chat_template(self) -> bool:
        return self.template_source is not None

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def render_chat(self, messages: list[dict]) -> str:
        """Render messages with the chat template and the assistant's generation prompt."""
        if self.template_source is None:
            raise BundleError("this bundle's model has no chat template", "pass --raw to feed the prompt as is")
        if self._template is None:
            from jinja2.sandbox import ImmutableSandboxedEnvironment

            env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)

            def raise_exception(message):
                raise BundleError(f"chat template refused the messages: {message}", "check the roles and order")

            env.globals["raise_exception"] = raise_exception
            self._template = env.from_string(self.template_source)
        return self._template.render(messages=messages, add_generation_prompt=True,
                                     bos_token=self.bos_token or "", eos_token=self.eos_token or "")

    def prompt_ids(self, prompt: str, raw: bool, system: str | None = None) -> list[int]:
        """Token ids for a user prompt: through the chat template unless ``raw`` or there is none."""
        if raw or not self.has_chat_template:
            return self.encode(prompt)
        messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": prompt}]
        return self.encode(self.render_chat(messages), add_special_tokens=False)


class StreamDecoder:
    """Turns a growing list of token ids into text deltas without splitting UTF-8 characters.

    Re-decodes the generated ids each step (a few hundred tokens at most on a board), which keeps
    tokenizer-specific merging of spaces and byte pieces exactly as in a one-shot decode.
    """

    def __init__(self, tokenizer: ChatTokenizer):
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self._emitted = 0  # characters of the decoded text already handed out

    def push(self, token_id: int) -> str:
        self.ids.append(token_id)
        text = self.tokenizer.decode(self.ids)
        if text.endswith("\ufffd"):  # an incomplete multi-byte character; wait for the next token
            return ""
        delta = text[self._emitted:]
        self._emitted = len(text)
        return delta

    def flush(self) -> str:
        """The text held back at the end of the answer (a final character that decodes to U+FFFD)."""
        text = self.tokenizer.decode(self.ids)
        delta = text[self._emitted:]
        self._emitted = len(text)
        return delta
