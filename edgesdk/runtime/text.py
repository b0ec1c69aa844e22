"""Tokenizer, chat template and streaming detokenization, on the ``tokenizers`` library alone."""

from __future__ import annotations

import codecs
import json
import re
from collections.abc import Callable
from pathlib import Path

from edgesdk.errors import BundleError, EdgeSDKError, iconv_to_utf8


class ChatTokenizer:
    """The bundle's tokenizer.json plus the model's chat template (Jinja, as transformers renders it)."""

    def __init__(self, tokenizer_path: Path, facts: dict, template_path: Path | None):
        self.tokenizer = load_tokenizer(tokenizer_path)
        self.eos_token_ids = set(facts.get("eos_token_ids", []))
        self.bos_token = facts.get("bos_token")
        self.eos_token = facts.get("eos_token")
        # the other special tokens the manifest records (pad_token), handed to the template (:meth:`_variables`)
        self._recorded_specials = {name: facts[name] for name in SPECIAL_TOKEN_VARIABLES
                                   if isinstance(facts.get(name), str)}
        self._specials: dict | None = None  # those, with the tokenizer's unknown token, found on first rendering
        self.template_source = read_chat_template(template_path) if template_path else None
        # extra variables every rendering gives the template (llama-server's --chat-template-kwargs), e.g.
        # {"enable_thinking": false} for Qwen3; a call's own template_kwargs go over them
        self.template_kwargs: dict = {}
        self._template = None
        self._system_role: tuple[str, bool] | None = None  # (template, whether it takes a system role), probed on first use
        self._token_bytes: list[bytes | None] | None = None
        self._stream_anchor: tuple[list[int], str] | None = None  # found on first use (text._stream_anchor)
        self._piece_bytes = None  # each token's bytes for a byte-fallback decoder (text._piece_bytes), first use
        self._byte_level_bytes = None  # each token's bytes for a byte-level decoder (text._byte_level_bytes), first use
        self._plain_text = None  # the tokenizer that reads special tokens' text as text, made on first use
        self._fim = None  # the fill-in-the-middle tokens (runtime/fim.py), found on first use
        self._control: set[int] | None = None  # the ids llama.cpp makes control tokens (control_ids), first use
        self._added_bos: tuple[int | None] | None = None  # the BOS the tokenizer adds (added_bos), found on first use
        # llama.cpp ends generation at the FIM pad, repo and file-separator tokens too (llama-vocab.cpp), and at the
        # end-of-turn tokens it finds by their text, whatever the build recorded (a bundle built before the list grew)
        self.eos_token_ids = end_of_generation_ids(self.tokenizer.token_to_id,
                                                   self.eos_token_ids | self.fim_tokens().end_of_generation)

    def token_bytes(self) -> list[bytes | None]:
        """Each token id's bytes (None for special tokens and the ids that end generation, for JSON mode
        never to take one before the object is complete); built on first use."""
        if self._token_bytes is None:
            from edgesdk.runtime.json_mode import token_bytes_table

            table = token_bytes_table(self.tokenizer, self.tokenizer.get_vocab_size(with_added_tokens=True))
            for token in self.eos_token_ids:  # an end-of-turn token the tokenizer does not mark special (Phi-3's <|end|>)
                if 0 <= token < len(table):
                    table[token] = None
            self._token_bytes = table
        return self._token_bytes

    def token_id(self, text: str) -> int | None:
        """The id of the one token whose text is ``text`` (``<|im_end|>``), None where none is."""
        return self.tokenizer.token_to_id(text)

    def fim_tokens(self):
        """The model's fill-in-the-middle tokens, found by their text as llama.cpp's vocab loader finds them
        (:func:`edgesdk.runtime.fim.find_fim_tokens`); found on first use."""
        if getattr(self, "_fim", None) is None:
            from edgesdk.runtime.fim import find_fim_tokens

            self._fim = find_fim_tokens(self.tokenizer.token_to_id)
        return self._fim

    @property
    def has_chat_template(self) -> bool:
        return self.template_source is not None

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=add_special_tokens).ids

    def plain_text(self):
        """A copy of the tokenizer that reads special tokens' text written in a text as plain text (llama.cpp's
        ``parse_special`` false: its tokenizer_st_partition leaves control tokens out of the split, as the tokenizers
        library's ``encode_special_tokens`` does; user-defined added tokens are still split out), for the texts
        llama.cpp tokenizes so: llama-perplexity's and its accuracy tasks', llama-server's ``/tokenize`` with
        ``parse_special`` false. Made on first use; the bundle's own tokenizer is not changed.

        The added tokens llama.cpp's vocab loader makes control tokens whatever the model marks them (:meth:`control_ids`:
        the FIM tokens and the end-of-generation tokens it finds by their text, Qwen2.5-Coder's ``<|fim_prefix|>`` ...
        ``<|file_sep|>`` among them, which its tokenizer.json marks not special) are read as plain text here too: code
        that holds ``<|fim_middle|>`` is its characters in an infill's prefix, not the FIM middle token."""
        if self._plain_text is None:
            import tokenizers

            document = json.loads(self.tokenizer.to_str())
            control = self.control_ids()
            for added in document.get("added_tokens") or []:
                if added.get("id") in control:
                    added["special"] = True
            plain = tokenizers.Tokenizer.from_str(json.dumps(document))
            plain.encode_special_tokens = True
            self._plain_text = plain
        return self._plain_text

    def control_ids(self) -> set[int]:
        """The ids llama.cpp's vocab loader makes control tokens (``LLAMA_TOKEN_ATTR_CONTROL``) however the model
        typed them (src/llama-vocab.cpp, "control-looking token ... its type will be overridden"): the FIM prefix,
        suffix, middle, pad, repo and file-separator tokens, CodeLlama's ``▁<EOT>`` (its GGUF's EOT) and the
        end-of-generation tokens it finds by their text (:func:`edgesdk.runtime.fim.find_fim_tokens`,
        :func:`end_of_generation_ids`); found on first use."""
        if getattr(self, "_control", None) is None:
            fim = self.fim_tokens()
            found = {fim.pre, fim.suf, fim.mid, fim.pad, fim.rep, fim.sep, fim.eot} - {None}
            self._control = found | end_of_generation_ids(self.tokenizer.token_to_id, ())
        return set(self._control)

    def encode_plain(self, text: str) -> list[int]:
        """The ids of ``text`` read as plain text (:meth:`plain_text`), no special token added."""
        return self.plain_text().encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int]) -> str:
        """``ids``' text, the special tokens and the control tokens (:meth:`control_ids`) left out, as llama.cpp's
        ``llama_token_to_piece`` without ``special`` writes nothing for a control token, Qwen2.5-Coder's
        ``<|fim_middle|>`` and Phi-3's ``<|end|>`` among them, which their tokenizer.json marks not special (the
        stream leaves out the same tokens, :func:`_special_ids`)."""
        self.control_ids()  # finds the control tokens on first use; decode reads the kept set, not a copy
        return self.tokenizer.decode([token for token in ids if token not in self._control], skip_special_tokens=True)

    def added_bos(self) -> int | None:
        """The BOS id the tokenizer puts in front of a text it encodes with its special tokens (llama.cpp's
        ``llama_vocab_get_add_bos``; :func:`edgesdk.runtime.fim.leading_bos`), None where it puts none (SmolLM2's,
        Qwen's); found on first use."""
        if getattr(self, "_added_bos", None) is None:
            from edgesdk.runtime.fim import leading_bos

            self._added_bos = (leading_bos(self),)
        return self._added_bos[0]

    def chat_ids(self, rendered: str) -> list[int]:
        """The token ids of a rendered chat (:meth:`render_chat`'s text): special tokens' text read as the tokens,
        and exactly one BOS in front where the tokenizer adds BOS, as llama.cpp tokenizes a chat prompt. Every
        place that encodes a rendered chat goes through here.

        llama.cpp (common/chat.cpp, ``common_chat_template_direct_apply``: "to avoid double BOS / EOS tokens")
        cuts the BOS token's text off the front of the rendering where the vocabulary adds BOS, then llama-server
        and llama-cli tokenize it with ``add_special`` and ``parse_special`` true, so the BOS goes in front
        whether the template writes ``{{ bos_token }}`` (Gemma's, Llama 3's) or not (TinyLlama's Zephyr-style
        template, which the model was still trained with BOS in front of); Ollama's runner too encodes the
        prompt with ``addSpecial`` (runner.go ``inputs``: ``Encode(part, i == 0)``). transformers'
        ``apply_chat_template`` tokenizes with ``add_special_tokens=False``, which leaves such a prompt without
        BOS. A tokenizer that adds no BOS (SmolLM2's) gets the rendering's ids as they are. Only BOS is put in:
        an EOS the tokenizer adds after a text (``add_eos_token``) would end the prompt before the answer."""
        bos = self.added_bos()
        if bos is None:
            return self.encode(rendered, add_special_tokens=False)
        written = self.tokenizer.id_to_token(bos)
        if written and rendered.startswith(written):
            rendered = rendered[len(written):]
        return [bos, *self.encode(rendered, add_special_tokens=False)]

    def render_chat(self, messages: list[dict], continue_final: bool = False, template_kwargs: dict | None = None) -> str:
        """Render messages with the chat template and the assistant's generation prompt, in the
        environment transformers' ``apply_chat_template`` gives templates (see :func:`chat_environment`).

        ``continue_final``: the last message is an assistant's answer begun by the caller (a prefill, as
        llama-server and Anthropic's Messages API take it), rendered as transformers' ``continue_final_message``
        does: the conversation without a generation prompt, its last message's text marked at its end and the
        rendering cut at the mark, so the model goes on from there; the text's trailing whitespace stays where
        the template keeps it. An empty one leaves the generation prompt, and so does one of whitespace alone where
        the template trims it (transformers would cut the rendering back over the turn's header there); where the
        template keeps it, the whitespace is kept, as transformers keeps it.

        The text is the final message's ``content``, or its last text part where the content is a list of parts
        (``{"type": "text", "text": ...}``; transformers continues the same one); no content (None) is no text.

        ``template_kwargs``: variables for the template beside :attr:`template_kwargs` (over them), as
        transformers' ``apply_chat_template(**kwargs)`` and llama-server's ``chat_template_kwargs`` pass them."""
        if self.template_source is None:
            raise BundleError("this bundle's model has no chat template", "pass --raw to feed the prompt as is")
        extra = {**self.template_kwargs, **(template_kwargs or {})}
        if not continue_final:
            return self._render(messages, add_generation_prompt=True, extra=extra)
        if not messages:
            raise BundleError("continue_final is set but there are no messages, so no final message to go on from",
                              "give the messages, the last one the assistant's begun answer")
        begun, final = marked_final_message(messages[-1])
        marked = self._render([*messages[:-1], final], add_generation_prompt=False, extra=extra) if begun else ""
        if not begun.strip():
            kept = marked.rfind(begun + CONTINUE_MARK) if begun else -1
            if kept >= 0:  # whitespace the template writes as given ("\n" to begin the answer on a new line)
                return marked[:kept + len(begun)]
            return self.render_chat(messages[:-1], template_kwargs=template_kwargs)
        at = marked.rfind(CONTINUE_MARK.strip())
        if at < 0 or begun.strip() not in marked[:at]:
            raise BundleError("the chat template does not write the final assistant message's text as given, so "
                              "the answer cannot go on from it", "end the messages with a user message")
        # a template that trims the text trims the mark's trailing space too: the text's own whitespace went with it
        return marked[:at] if marked.startswith(CONTINUE_MARK, at) else marked[:at].rstrip()

    def _render(self, messages: list[dict], add_generation_prompt: bool, extra: dict | None = None) -> str:
        import jinja2

        try:
            if self._template is None:
                self._template = chat_environment().from_string(self.template_source)
            if messages and messages[0].get("role") == "system" and not self._takes_system_role():
                messages = merged_system_message(messages)
            return self._template.render(**self._variables(extra), messages=messages, tools=None, documents=None,
                                         add_generation_prompt=add_generation_prompt)
        except jinja2.TemplateError as exc:
            raise BundleError(f"the bundle's chat template failed: {type(exc).__name__}: {exc}",
                              "pass --raw to feed the prompt as is, or rebuild with a corrected template") from exc
        except EdgeSDKError:  # raise_exception: the template refused the messages
            raise
        except Exception as exc:  # the template's code on a value it did not expect (a template variable's)
            failed, rebuild = f"{type(exc).__name__}: {exc}", "pass --raw, or rebuild with a fixed template"
            if not extra or self._fails_without(messages, add_generation_prompt, exc):
                raise BundleError(f"the bundle's chat template failed: {failed}", rebuild) from exc
            raise BundleError(f"the bundle's chat template failed with the template variables "
                              f"{', '.join(sorted(extra))} (chat_template_kwargs): {failed}",
                              "give those variables values of the kind the template expects, or leave them "
                              "out") from exc

    def _variables(self, extra: dict | None = None) -> dict:
        """The variables a rendering gives the template beside the messages: the tokenizer's special tokens, as
        transformers' ``apply_chat_template`` passes its tokenizer's ``special_tokens_map`` (a template may write
        ``{{ pad_token }}`` or ``{{ unk_token }}`` as well as ``{{ bos_token }}``), then ``extra`` over them (as
        transformers' kwargs go over the special tokens). A special token the bundle does not record stays undefined,
        as transformers leaves one its tokenizer does not have; ``bos_token`` and ``eos_token`` are always set."""
        if self._specials is None:
            specials = dict(self._recorded_specials)
            if "unk_token" not in specials:
                unknown = model_unk_token(self.tokenizer)
                if unknown is not None:
                    specials["unk_token"] = unknown
            self._specials = specials
        return {**self._specials, **(extra or {}), "bos_token": self.bos_token or "", "eos_token": self.eos_token or ""}

    def _fails_without(self, messages: list[dict], add_generation_prompt: bool, exc: Exception) -> bool:
        """Whether the template fails on ``messages`` (as :meth:`_render` handed them) with no template variables
        beside its own as it failed with them, ``exc`` (its type and text): a template that fails so whatever the
        variables are failed on its own code, and an error that blamed the variables (a server's
        --chat-template-kwargs, on every request) sent the user to change what is not at fault. Another failure
        without them (the UndefinedError of a variable the template reads unguarded) or none blames the variables."""
        try:
            self._template.render(**self._variables(), messages=messages, tools=None, documents=None,
                                  add_generation_prompt=add_generation_prompt)
        except Exception as without:  # the template's own failure, or its refusal of the messages
            return type(without) is type(exc) and str(without) == str(exc)
        return False

    def _takes_system_role(self) -> bool:
        """Whether the chat template writes a system message's text, probed once per template as llama.cpp probes
        it (minja's ``chat_template`` constructor, ``supports_system_role``: a system message and a user message,
        each a needle, rendered without a generation prompt; a template that raises on them (Gemma 2's "System role
        not supported", Mistral v0.2's "Conversation roles must alternate") or leaves the system text out takes
        none; llama.cpp's own engine, common/jinja/caps.cpp, asks the same of the same two messages)."""
        known = getattr(self, "_system_role", None)
        if known is not None and known[0] == self.template_source:
            return known[1]
        needle = "<System Needle>"
        try:
            probe = self._template.render(messages=[{"role": "system", "content": needle},
                                                    {"role": "user", "content": "<User Needle>"}],
                                          tools=None, documents=None, add_generation_prompt=False,
                                          **self._variables())
        except Exception:  # the template refused the system message (raise_exception) or failed on it
            probe = ""
        self._system_role = (self.template_source, needle in probe)
        return self._system_role[1]

    def prompt_ids(self, prompt: str, raw: bool, system: str | None = None) -> list[int]:
        """Token ids for a user prompt: through the chat template unless ``raw`` or there is none.

        An empty ``system`` is a system message with no text, as transformers renders it: templates
        that add a default system prompt when there is none (SmolLM2's) then add none."""
        check_utf8(prompt, "the prompt")
        if system is not None:
            check_utf8(system, "--system")
        if raw or not self.has_chat_template:
            return self.encode(prompt)
        messages = ([] if system is None else [{"role": "system", "content": system}]) + [
            {"role": "user", "content": prompt}]
        return self.chat_ids(self.render_chat(messages))


# The texts of the tokens llama.cpp's vocab loader puts among the ids that end generation (src/llama-vocab.cpp,
# ``llama_vocab::impl::load``: "maintain a list of tokens that cause end-of-generation", ``special_eog_ids``), in its
# order. Its EOT texts ("find EOT token") are all among them; DeepSeek's <｜end▁of▁sentence｜> is one, so
# DeepSeek-Coder-Instruct, whose EOS is <|EOT|>, stops at it too.
END_OF_GENERATION_TEXTS = ("<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
                           "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]",
                           "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
                           "<｜end▁of▁sentence｜>", "[e~[")


def end_of_generation_ids(token_id: Callable[[str], int | None], ids) -> set[int]:
    """The ids that end generation as llama.cpp's vocab loader finds them: ``ids`` (the model's EOS ids) and each
    token whose text is one of END_OF_GENERATION_TEXTS (``token_id(text)``: its id in the whole vocabulary, None
    where there is none), less the two it takes out again (src/llama-vocab.cpp): ``<|end|>`` where ``<|return|>``
    and ``<|call|>`` (gpt-oss's o200k_harmony), or ``<|calls|>``/``<|call|>`` and ``<|flush|>`` (Solar Open), end
    generation too, since there it ends a message, not the answer (gpt-oss's analysis before its final answer); and
    ``</s>`` where ``<|tool_response>`` (Gemma 4) does."""
    found = set(ids) | {token for token in map(token_id, END_OF_GENERATION_TEXTS) if token is not None}

    def held(text: str) -> bool:
        token = token_id(text)
        return token is not None and token in found

    call = held("<|call|>") or held("<|calls|>")
    if held("<|end|>") and call and (held("<|return|>") or held("<|flush|>")):
        found.discard(token_id("<|end|>"))
    if held("</s>") and held("<|tool_response>"):
        found.discard(token_id("</s>"))
    return found


def merged_system_message(messages: list[dict]) -> list[dict]:
    """The messages for a chat template that takes no system role (:meth:`ChatTokenizer._takes_system_role`), as
    llama.cpp hands them to it (common/chat.cpp, ``workaround::system_message_not_supported``, applied where the
    template's caps say ``supports_system_role`` false): the leading system message's text goes in front of the
    next message's, a line break between them, and the system message is dropped; one with no text is dropped
    and the next message left as it is (minja's ``polyfill_system_role``, which merges only a system text that is
    not empty, as llama-cli adds no system message for an empty ``-sys``). transformers'
    ``apply_chat_template`` renders the messages as given, so such a template raises. A system message alone is
    left as it is, for the template to refuse (a 400 that names why) where llama.cpp drops it with a warning in its
    log and renders no message at all."""
    if len(messages) < 2:
        return list(messages)
    system, following = messages[0], messages[1]
    if not (isinstance(system.get("content"), str) and isinstance(following.get("content"), str)):
        return list(messages)  # typed content: rendered as given, for the template to take or refuse
    if not system["content"]:
        return list(messages[1:])
    return [{**following, "content": system["content"] + "\n" + following["content"]}, *messages[2:]]


def marked_final_message(message: dict) -> tuple[str, dict]:
    """The text a continued final message ends with, and a copy of the message with :data:`CONTINUE_MARK` after
    that text: its ``content``, or the last part with a ``text`` where the content is a list of parts (as
    transformers' ``continue_final_message`` picks it); None (no content) is no text. A BundleError where the
    content holds no text to go on from."""
    content = message.get("content")
    if content is None:
        return "", {**message, "content": CONTINUE_MARK}
    if isinstance(content, str):
        return content, {**message, "content": content + CONTINUE_MARK}
    if isinstance(content, (list, tuple)):
        for index in reversed(range(len(content))):
            part = content[index]
            if isinstance(part, dict) and isinstance(part.get("text"), str):
                parts = [*content[:index], {**part, "text": part["text"] + CONTINUE_MARK}, *content[index + 1:]]
                return part["text"], {**message, "content": parts}
    raise BundleError(f"the final assistant message's content ({type(content).__name__}: {str(content)[:60]!r}) "
                      "holds no text for the answer to go on from",
                      "give its content as a string, or as a list of parts one of which has a \"text\"")


# the special tokens beside bos_token and eos_token that transformers' apply_chat_template gives every template (its
# tokenizer's special_tokens_map), each where the tokenizer has one; template kwargs may replace them, as there
SPECIAL_TOKEN_VARIABLES = ("unk_token", "sep_token", "pad_token", "cls_token", "mask_token")

# the variables every rendering sets itself: template kwargs cannot replace them
TEMPLATE_VARIABLES = ("messages", "tools", "documents", "add_generation_prompt", "bos_token", "eos_token")


def check_template_kwargs(value: object, where: str) -> dict:
    """``chat_template_kwargs`` (a JSON object of extra template variables) checked, or a ValueError naming
    what is wrong: not an object, or a key the rendering sets itself."""
    if not isinstance(value, dict):
        raise ValueError(f"{where} must be a JSON object of template variables (e.g. {{\"enable_thinking\": false}}), "
                         f"got {type(value).__name__}")
    taken = sorted(key for key in value if key in TEMPLATE_VARIABLES)
    if taken:
        raise ValueError(f"{where} sets {', '.join(taken)}, which the rendering sets itself "
                         f"({', '.join(TEMPLATE_VARIABLES)}); leave {'it' if len(taken) == 1 else 'them'} out")
    return dict(value)


# appended to a begun answer to find where its text ends in the rendering (transformers' tag, trailing space
# included: a template that trims the text trims it)
CONTINUE_MARK = "CONTINUE_FINAL_MESSAGE_TAG "


def read_chat_template(path: Path) -> str:
    """The bundle's chat template, or a BundleError naming a file that is no UTF-8 text (the manifest's
    ``tokenizer.chat_template`` naming the weights, or a damaged chat_template.jinja whose digest was rewritten: the
    manifest already names it, so rebuilding is the fix)."""
    path = Path(path)
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        rebuild = "rebuild the bundle with 'edgesdk build'"
        raise BundleError(f"{path} is not a chat template: it does not read as UTF-8 text ({exc})",
                          rebuild if path.name == "chat_template.jinja" else "point the manifest's "
                          f"'tokenizer.chat_template' at the bundle's chat_template.jinja, or {rebuild}") from exc


def model_unk_token(tokenizer) -> str | None:
    """The unknown token the tokenizer.json's model names (a BPE, WordPiece or WordLevel model's ``unk_token``, a
    Unigram model's ``unk_id``), or None: transformers' ``unk_token`` for a tokenizer that has one (Llama 2's, Gemma's,
    Phi-3's ``<unk>``), which the manifest does not record."""
    model = tokenizer.model
    unknown = getattr(model, "unk_token", None)
    if isinstance(unknown, str):
        return unknown
    if type(model).__name__ != "Unigram":  # no unk_token attribute: its unk_id is only in the JSON
        return None
    described = json.loads(tokenizer.to_str()).get("model", {})
    index, vocab = described.get("unk_id"), described.get("vocab") or []
    if isinstance(index, int) and 0 <= index < len(vocab) and isinstance(vocab[index][0], str):
        return vocab[index][0]
    return None


def load_tokenizer(path: Path):
    """``tokenizers.Tokenizer`` from the bundle's tokenizer.json, or a BundleError that tells a file that is no
    tokenizer.json (not JSON, or JSON without a ``model``) from one the installed tokenizers is too old for: a
    release older than the one that wrote the file cannot parse it (tokenizers < 0.20 reads no BPE merges stored
    as pairs, and says only 'data did not match any variant').

    The file's ``truncation`` and ``padding`` are dropped: a sentence-transformers model's tokenizer.json often sets
    them (cut at ``max_length`` 128 or 512, padded to a ``Fixed`` length with pad tokens), which the build copies into
    the bundle, and they silently cut prompts and texts to embed and appended pad tokens the pooling read. llama.cpp's
    tokenizer has neither (a GGUF carries no such setting): llama-server reads every token, refusing a text past the
    context, and so does edgesdk."""
    import tokenizers

    try:
        tokenizer = tokenizers.Tokenizer.from_file(str(path))
        tokenizer.no_truncation()
        tokenizer.no_padding()
        return tokenizer
    except Exception as exc:  # tokenizers raises a plain Exception for a file it cannot parse
        shape = _tokenizer_json_shape(path)
        if shape:
            raise BundleError(f"{path} is not a tokenizer.json: {shape}",
                              "point the manifest's 'tokenizer.file' at the bundle's tokenizer.json, or rebuild "
                              "the bundle with 'edgesdk build'") from exc
        raise BundleError(
            f"tokenizers {tokenizers.__version__} could not read {path} ({exc})",
            "a tokenizer.json written by a newer tokenizers needs that release here: pip install -U tokenizers "
            "(at least the version 'edgesdk env' shows on the host that built the bundle)",
        ) from exc


def _tokenizer_json_shape(path: Path) -> str:
    """What keeps ``path`` from being a tokenizer.json at all, or "" when it has the shape of one."""
    try:
        data = Path(path).read_bytes()
    except OSError as exc:  # no file there, a directory, no permission to read it
        return f"it cannot be read ({exc.strerror or exc})"
    try:
        document = json.loads(data)
    except ValueError as exc:  # UnicodeDecodeError is a ValueError
        return f"it does not read as JSON ({exc})"
    if not isinstance(document, dict) or not isinstance(document.get("model"), dict):
        return "its JSON has no 'model' object (a tokenizer.json holds the tokenizer's model, vocabulary and merges)"
    return ""


def check_utf8(text: str, what: str) -> None:
    """Refuse text that came in as bytes that are not UTF-8: Python hands them over as lone
    surrogates (``surrogateescape``), which the tokenizer cannot take; and the lone surrogate a JSON
    ``\\uD83D`` escape without the other half of its pair gives (a client that cut a string between the halves)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        bad = ord(exc.object[exc.start])
        if 0xDC80 <= bad <= 0xDCFF:  # a byte that is not UTF-8, escaped (surrogateescape)
            # the bytes it came in as; a lone surrogate no byte gives (a JSON escape's) read as '?'
            data = re.sub("[\ud800-\udc7f\udd00-\udfff]", "?", text).encode("utf-8", "surrogateescape")
            raise EdgeSDKError(f"{what} is not valid UTF-8 (byte 0x{bad - 0xDC00:02x} at character {exc.start})",
                               f"pass UTF-8 text ({iconv_to_utf8(data)} makes it UTF-8)") from exc
        raise EdgeSDKError(f"{what} is not valid UTF-8 (U+{bad:04X} at character {exc.start}): half of a UTF-16 "
                           f"surrogate pair, as a \\u{bad:04x} JSON escape without the other half gives",
                           "send each character whole: both \\uXXXX escapes of a surrogate pair together, or the "
                           "character itself") from exc


# the oldest Jinja whose sandbox has no known escape (transformers refuses older ones for chat templates)
SAFE_JINJA = (3, 1, 6)


def chat_environment():
    """A sandboxed Jinja environment with what transformers gives chat templates: ``{% break %}`` and
    ``{% continue %}``, the ``{% generation %}`` block (rendered as its body), ``strftime_now``,
    ``raise_exception``, and a ``tojson`` that writes UTF-8 as it is (Jinja's own escapes HTML).

    A chat template is code from the model's repository, run in the sandbox: as transformers does
    (chat_template_utils.py, ``_cached_compile_jinja_template``: "Older versions have known sandbox escapes"), a
    Jinja older than 3.1.6 is refused, whose sandbox a template escapes through ``str.format`` (CVE-2024-56326) or
    the ``attr`` filter (CVE-2025-27516)."""
    from datetime import datetime

    import jinja2
    from jinja2 import ext, nodes
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    installed = tuple(int(re.match(r"\d*", part).group() or 0) for part in jinja2.__version__.split(".")[:3])
    if installed < SAFE_JINJA:
        raise EdgeSDKError(f"jinja2 {jinja2.__version__} is installed, and chat templates need jinja2 >= "
                           f"{'.'.join(map(str, SAFE_JINJA))}: older releases' sandbox lets a template run code "
                           "outside it (CVE-2024-56326, CVE-2025-27516)",
                           "pip install -U 'jinja2>=3.1.6' (or pass --raw to feed the prompt without the template)")

    class GenerationBlock(ext.Extension):
        """``{% generation %}...{% endgeneration %}`` marks the assistant's tokens for training masks."""

        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

        def _body(self, caller):
            return caller()

    def raise_exception(message):
        raise BundleError(f"{TEMPLATE_REFUSED}{message}", template_refusal_fix(str(message)))

    def tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[GenerationBlock, ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env


# words of a template's refusal that is about the messages' roles or their order (Gemma 2's "System role not
# supported", Mistral's "Conversation roles must alternate user/assistant/..." and "Only user and assistant roles are
# supported!", Qwen3's "No user query found in messages.")
ROLE_REFUSAL = re.compile(r"\broles?\b|alternat|\b(system|user|assistant)\b", re.IGNORECASE)


# the words in front of a chat template's own refusal (raise_exception), its message after them (serve reads it)
TEMPLATE_REFUSED = "chat template refused the messages: "


def template_refusal_fix(message: str, terms: str = "cli") -> str:
    """The fix for a chat template's own refusal (``raise_exception``), true whatever the template's words: a
    template refuses for its own reasons (Llama 3.1's "This model only supports single tool-calls at once!", a word it
    does not take), which the problem quotes; the caller can change the messages, or feed the prompt without the
    template. A refusal that names roles or their order says so first. ``terms`` words it for who reads it, as
    edgesdk.bundle.CONTEXT_TERMS does: the command line (``cli``), a server's client (``server``), the Python API
    (``python``); a client has no --raw to pass, nor a caller --system."""
    roles = ROLE_REFUSAL.search(message) is not None
    change = ("give the messages the roles, in the order, that the template's message asks for" if roles else
              "change the messages so the template takes them" + (" (the prompt, --system or the conversation so far)"
                                                                  if terms == "cli" else ""))
    if terms == "server":
        return (f"{change}, or send the prompt already rendered, which no template reads: /v1/completions, or "
                "Ollama's /api/generate with \"raw\": true")
    if terms == "python":
        return f"{change}, or pass the prompt already rendered to create_completion, which no template reads"
    return (f"{change}, or pass --raw to feed the prompt without the template (a server's /v1/completions takes a "
            "prompt as it is)")


# Plain one-character tokens a stream is decoded after (the first the vocabulary has as itself).
STREAM_ANCHORS = ("a", "x", "0", ".")


def _stream_anchor(tokenizer) -> tuple[list[int], str]:
    """A plain token to decode a stream after, and its text; ([], "") where the vocabulary has none that decodes
    to itself alone and twice over (the stream is then decoded on its own). Found once per tokenizer."""
    cached = getattr(tokenizer, "_stream_anchor", None)
    if cached is not None:
        return cached
    anchor: tuple[list[int], str] = ([], "")
    inner = getattr(tokenizer, "tokenizer", None)
    if inner is not None and hasattr(inner, "token_to_id"):
        for text in STREAM_ANCHORS:
            token = inner.token_to_id(text)
            if token is not None and tokenizer.decode([token]) == text and tokenizer.decode([token, token]) == text * 2:
                anchor = ([token], text)
                break
    if isinstance(tokenizer, ChatTokenizer):
        tokenizer._stream_anchor = anchor
    return anchor


def _decoded_after_anchor(tokenizer, decode: Callable[[list[int]], str], ids: list[int]) -> str:
    """``decode(ids)`` keeping the first token's leading space: decoded after the stream anchor, which is then cut
    off (a SentencePiece decoder strips the leading space of the text it decodes)."""
    anchor, anchor_text = _stream_anchor(tokenizer)
    if anchor:
        text = decode(anchor + list(ids))
        if text.startswith(anchor_text):
            return text[len(anchor_text):]
    return decode(list(ids))


# a SentencePiece byte-fallback token's text: one byte, <0x00> to <0xFF>
BYTE_PIECE = re.compile(r"<0x[0-9A-Fa-f]{2}>")


def _decoder_steps(inner) -> list[dict]:
    """The steps of a tokenizers ``Tokenizer``'s decoder, from its JSON: a Sequence's list, else the one decoder;
    ``[{}]`` where it has none or gives no JSON (the stream then decodes through the tokenizer)."""
    decoder = getattr(inner, "decoder", None)
    try:
        spec = json.loads(decoder.__getstate__()) if decoder is not None else {}
    except Exception:  # a decoder that does not give its JSON
        spec = {}
    return (spec.get("decoders") or []) if spec.get("type") == "Sequence" else [spec]


def _special_ids(tokenizer) -> set[int]:
    """The ids whose text the output leaves out, as :meth:`ChatTokenizer.decode` does: the special added tokens of
    its tokenizers ``Tokenizer`` (those ``skip_special_tokens`` skips) and the tokens llama.cpp makes control tokens
    whatever the model marks them (:meth:`ChatTokenizer.control_ids`)."""
    inner = tokenizer.tokenizer
    special = {token for token, added in inner.get_added_tokens_decoder().items() if added.special}
    control = getattr(tokenizer, "control_ids", None)
    return special | (control() if control is not None else set())


def _piece_bytes(tokenizer) -> Callable[..., bytes] | None:
    """Each token's bytes as llama.cpp's ``llama_token_to_piece`` gives them (special and control tokens none
    (:func:`_special_ids`), or with ``specials`` their text), for a SentencePiece tokenizer with byte fallback
    (Llama 2's, TinyLlama's, Mistral's, Gemma's decoder: U+2581 as a space, ``<0xNN>`` as byte NN, then Fuse, and
    Llama 2's Strip of the text's leading space, which the stream keeps); None for any other decoder (byte-level
    BPE's decodes the bytes of the text it is given whole, invalid ones alone replaced, as wanted).

    The tokenizers library's ByteFallback decoder reads a run of ``<0xNN>`` tokens as one: where the run's bytes
    are not all valid UTF-8, every byte of the run becomes U+FFFD, the valid characters in it too. A stray byte the
    model samples then turned all the byte-fallback characters after it into U+FFFD (a Llama 2 answer in Chinese,
    most of whose characters are byte tokens), and a stream held them all back until the run ended. llama.cpp joins
    the pieces' bytes, and only the invalid ones are replaced (Python's ``errors="replace"``, the Unicode
    standard's practice). Found once per tokenizer."""
    cached = getattr(tokenizer, "_piece_bytes", None)
    if cached is not None:
        return cached or None
    found = False
    inner = getattr(tokenizer, "tokenizer", None)
    parts = _decoder_steps(inner)

    def plain(part: dict) -> bool:  # a decoder step the bytes below give the text of
        kind = part.get("type")
        if kind == "Replace":
            return part.get("pattern") == {"String": "\u2581"} and part.get("content") == " "
        if kind == "Metaspace":
            return part.get("replacement") == "\u2581"
        if kind == "Strip":  # Llama 2's: the leading space of the whole text, which a stream keeps
            return part.get("content") == " " and not part.get("stop")
        return kind in ("ByteFallback", "Fuse")

    if any(part.get("type") == "ByteFallback" for part in parts) and all(map(plain, parts)):
        special = _special_ids(tokenizer)

        def piece_bytes(token: int, specials: bool = False) -> bytes:
            if token in special:  # its text where special tokens are written out (llama-server's /detokenize)
                return inner.id_to_token(token).encode("utf-8") if specials else b""
            piece = inner.id_to_token(token)
            if piece is None:
                return b""
            if BYTE_PIECE.fullmatch(piece):
                return bytes((int(piece[3:5], 16),))
            return piece.replace("\u2581", " ").encode("utf-8")

        found = piece_bytes

    if isinstance(tokenizer, ChatTokenizer):
        tokenizer._piece_bytes = found
    return found or None


def _byte_level_bytes(tokenizer) -> Callable[[int], bytes] | None:
    """Each token's bytes as the tokenizers library's ``ByteLevel`` decoder reads them (GPT-2's, SmolLM2's, Qwen's,
    Llama 3's tokenizer.json), special and control tokens none, as :meth:`ChatTokenizer.decode` skips them; None for
    any other decoder. The decoder maps each character of a piece through GPT-2's byte-to-unicode table, a piece with
    a character outside the table (an added token written as plain text) taken as its UTF-8 whole, then decodes the
    bytes of the whole text, invalid ones replaced; the stream decodes the same bytes, so its text is the
    tokenizer's, and it can tell a character still coming from a stray byte (llama.cpp's ``llama_token_to_piece``
    likewise gives a byte-level token's bytes, ``llama_decode_text``). Found once per tokenizer; each token's bytes
    on first use."""
    cached = getattr(tokenizer, "_byte_level_bytes", None)
    if cached is not None:
        return cached or None
    found = False
    inner = getattr(tokenizer, "tokenizer", None)
    parts = _decoder_steps(inner)
    if parts and all(part.get("type") == "ByteLevel" for part in parts):
        from edgesdk.runtime.json_mode import _byte_level_alphabet

        alphabet = _byte_level_alphabet()
        special = _special_ids(tokenizer)
        known: dict[int, bytes] = {}

        def piece_bytes(token: int) -> bytes:
            data = known.get(token)
            if data is None:
                piece = None if token in special else inner.id_to_token(token)
                if piece is None:
                    data = b""
                else:
                    try:
                        data = bytes(alphabet[char] for char in piece)
                    except KeyError:  # a character outside the table: the decoder takes the piece's UTF-8
                        data = piece.encode("utf-8")
                known[token] = data
            return data

        found = piece_bytes
    if isinstance(tokenizer, ChatTokenizer):
        tokenizer._byte_level_bytes = found
    return found or None


def _stream_bytes(tokenizer) -> Callable[[int], bytes] | None:
    """Each token's bytes for a stream (:func:`_piece_bytes` for byte fallback, :func:`_byte_level_bytes` for
    byte-level BPE), special and control tokens none; None where the tokens' text comes only from the tokenizer's
    decoder."""
    return _piece_bytes(tokenizer) or _byte_level_bytes(tokenizer)


def pieces_text(tokenizer: ChatTokenizer, ids: list[int]) -> str:
    """``ids`` as llama.cpp joins their pieces (llama-server's ``POST /detokenize``, ``tokens_to_str``): special
    tokens written out, and the first token's leading space kept; a byte-fallback tokenizer's from the tokens'
    bytes (:func:`_piece_bytes`), so that an invalid byte takes no valid character with it."""
    piece_bytes = _piece_bytes(tokenizer)
    if piece_bytes is not None:
        return b"".join(piece_bytes(token, specials=True) for token in ids).decode("utf-8", errors="replace")
    return _decoded_after_anchor(tokenizer, lambda some: tokenizer.tokenizer.decode(some, skip_special_tokens=False),
                                 ids)


BROKEN_UTF8 = "edgesdk.broken-utf8"  # the decode error handler that marks bytes that are no UTF-8 (:func:`broken_end`)
BROKEN_MARK = "\udcff"  # its mark, where errors="replace" writes U+FFFD: a lone surrogate, which no UTF-8 decodes to
codecs.register_error(BROKEN_UTF8, lambda error: (BROKEN_MARK, error.end))


def broken_end(tokenizer: ChatTokenizer, ids: list[int], text: str) -> int:
    """How many of the U+FFFD characters ``text`` ends with stand for bytes that are no whole UTF-8 character (a
    character the answer's end cut short, a stray byte), told from the bytes of the tokens ``ids`` that ``text`` was
    decoded from (their whole text, or its beginning where a stop string cut it): a U+FFFD the model wrote (its bytes
    EF BF BD) is a character of the answer like any other, which a text alone cannot tell from a cut one. Where the
    tokens' bytes are not known (a tokenizer whose text comes only from its decoder, :func:`_stream_bytes`) or
    ``text`` is not their text, every U+FFFD it ends with is counted."""
    ends = len(text) - len(text.rstrip("\ufffd"))
    piece_bytes = _stream_bytes(tokenizer) if ends else None
    if piece_bytes is None:
        return ends
    head = b"".join(map(piece_bytes, ids)).decode("utf-8", errors=BROKEN_UTF8)[:len(text)]
    if head.replace(BROKEN_MARK, "\ufffd") != text:
        return ends
    return len(head) - len(head.rstrip(BROKEN_MARK))


class StreamDecoder:
    """Turns a growing list of token ids into text deltas without splitting UTF-8 characters.

    Each step decodes the ids from the last point the text handed out ended at a whole character (the token
    before it kept for context), not the whole answer again, which keeps tokenizer-specific merging of spaces
    and byte pieces exactly as in a one-shot decode while a step costs the same at the answer's 10,000th token as
    at its 10th (an answer that --context-shift keeps going has no length bound; re-decoding it whole at each
    step made every step slower than the one before). This is the prefix/read offset scheme of transformers'
    ``TextStreamer`` and text-generation-inference's ``decode_token``.

    The ids are decoded after a plain anchor token whose text is then cut off: a SentencePiece
    tokenizer's decoder (Llama 2's ``Strip``, the ``Metaspace`` decoder) drops the leading space of the
    text it decodes, which for an answer is the space its first token begins with ("▁is" after "The
    capital of France" gave "is"). llama.cpp hands out each token's piece with its space (``llama_token_to_piece``
    without lstrip, as llama-server streams), so the answer's text continues its prompt's.
    """

    def __init__(self, tokenizer: ChatTokenizer):
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        # ids[_prefix:_read] are the tokens whose text was handed out last (decoded again as the next text's
        # context); ids[_read:] those whose text is still to come (a character whose bytes are still coming)
        self._prefix = 0
        self._read = 0

    def _decode(self, ids: list[int]) -> str:
        """``ids``' text (the anchor's cut off); a byte-fallback or byte-level tokenizer's from the tokens' bytes
        (:func:`_stream_bytes`), so that an invalid byte takes no valid character with it."""
        piece_bytes = _stream_bytes(self.tokenizer)
        if piece_bytes is not None:
            return b"".join(map(piece_bytes, ids)).decode("utf-8", errors="replace")
        return _decoded_after_anchor(self.tokenizer, self.tokenizer.decode, ids)

    def _delta(self, final: bool) -> str:
        shown = self._decode(self.ids[self._prefix:self._read])
        text = self._decode(self.ids[self._prefix:])
        if not final and self._incomplete(text):  # an incomplete multi-byte character; wait for the next token
            return ""
        if len(text) <= len(shown):  # no text yet (a special token's): the window stays as it is
            return ""
        self._prefix, self._read = self._read, len(self.ids)
        return text[len(shown):]

    def _incomplete(self, text: str) -> bool:
        """Whether the window's text ends in a character whose bytes are still coming. A byte-fallback or
        byte-level tokenizer's is told from the bytes (:func:`_stream_bytes`): only a valid start of a character
        waits, as llama-server's ``validate_utf8`` holds back only a multi-byte character cut off at the end; a byte
        that can begin no character (a stray continuation byte, 0xFF) is U+FFFD at once, and so is a real U+FFFD in
        the text. Held back too, a run of such bytes kept the window growing, each token decoding it all again (a
        stream of 4,000 stray bytes took seconds, and showed nothing until a valid character came). Other
        tokenizers: a text that ends in U+FFFD."""
        piece_bytes = _stream_bytes(self.tokenizer)
        if piece_bytes is None:
            return text.endswith("\ufffd")
        if not text.endswith("\ufffd"):
            return False
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        decoder.decode(b"".join(map(piece_bytes, self.ids[self._prefix:])))  # the window's (text's) bytes
        return bool(decoder.getstate()[0])

    def push(self, token_id: int) -> str:
        self.ids.append(token_id)
        return self._delta(final=False)

    def flush(self) -> str:
        """The text held back at the end of the answer (a final character that decodes to U+FFFD)."""
        return self._delta(final=True)
