"""Chat ``logprobs.content[].token`` of a piece that ends inside a UTF-8 character is cut before that character, as
llama-server writes it (``validate_utf8`` in ``completion_token_output::probs_vector_to_json``), with ``bytes``
whole; before, it read U+FFFD."""

from __future__ import annotations

from edgesdk.runtime.logprobs import TokenLogprob
from edgesdk.serve.api import CompletionRequest, logprobs_body

PROMPT = "The quick brown fox jumps over the lazy dog"


def test_chat_token_of_a_piece_ending_inside_a_character_is_cut_as_llama_server_cuts_it():
    pieces = {1: "é".encode() + "€".encode()[:2], 2: b"\x80", 3: b"ok", 4: "😀".encode()[:3], 5: "€".encode()}
    entry = TokenLogprob(1, -0.5, ((1, -0.5), (2, -1.0), (3, -2.0), (4, -2.5), (5, -3.0)))
    content = logprobs_body(CompletionRequest(chat=True, prompt="x"), [entry], pieces.__getitem__)["content"]
    assert (content[0]["token"], content[0]["bytes"]) == ("é", list(pieces[1]))
    assert [(alt["token"], alt["bytes"]) for alt in content[0]["top_logprobs"]] == \
        [("é", list(pieces[1])), ("\ufffd", [0x80]), ("ok", list(b"ok")), ("", list(pieces[4])), ("€", list(pieces[5]))]


def test_a_served_chat_answer_of_unfinished_characters_shows_them_as_llama_server_does(served, runtime):
    """A chat answer made of the lone lead byte of a three-byte character (logit_bias forces it): each token reads
    as nothing, its bytes stay whole, and POST /completion (llama-server's own form) shows the same tokens."""
    table = runtime.tokenizer.token_bytes()
    lead = table.index(b"\xe2")
    bias = {"logit_bias": {str(lead): 100}, "max_tokens": 3, "temperature": 0}
    status, body = served.post("/v1/chat/completions", {"messages": [{"role": "user", "content": PROMPT}],
                                                        "logprobs": True, "top_logprobs": 2, **bias})
    assert status == 200, body
    content = body["choices"][0]["logprobs"]["content"]
    assert [(entry["token"], entry["bytes"]) for entry in content] == [("", [0xE2])] * 3
    status, native = served.post("/completion", {"prompt": PROMPT, "n_probs": 2, **bias})
    assert status == 200, native
    assert [(entry["token"], entry["bytes"]) for entry in native["completion_probabilities"]] == [("", [0xE2])] * 3
