"""``GET /slots`` and the task ids while an embedding runs, as llama-server shows them: an embedding request makes a
task of each input, its ids taken one after another (tools/server/server-context.cpp, handle_embeddings_impl), and
the slot runs them in turn, showing the task of the input being embedded now. Real servers over a tiny bundle, the
slots read over HTTP from inside each pass's step."""

from __future__ import annotations

import json

from edgesdk.serve.completion import ServeDefaults
from tests.unit.test_serve import Served


class SlotsAtEachStep:
    """A StepHook that reads ``GET /slots`` before every step, with the prompt tokens of the slot's task."""

    def __init__(self):
        self.server: Served | None = None
        self.seen: list[tuple] = []

    def begin(self, prompt_tokens: int, max_new_tokens: int) -> None:
        pass

    def before_step(self, kind: str) -> float:
        if kind == "prefill":
            status, _, payload = self.server.request("GET", "/slots")
            assert status == 200, payload
            (slot,) = json.loads(payload)
            running = self.server.completer.slot
            self.seen.append((slot["id_task"], slot["is_processing"], slot["next_token"]["n_decoded"],
                              running.prompt_tokens))
        return 0.0

    def after_step(self, kind: str, tokens: int, compute_s: float) -> None:
        pass

    def end(self, stats) -> None:
        pass


def test_each_input_is_its_own_task_and_the_slot_shows_the_one_running(runtime):
    hook = SlotsAtEachStep()
    server = hook.server = Served(runtime, ServeDefaults(max_tokens=2), hook=hook)
    try:
        status, answer = server.post("/v1/embeddings", {"input": [[5, 6], [5, 6, 7, 8], [5, 6, 7]]})
        assert status == 200, answer
        assert [item["index"] for item in answer["data"]] == [0, 1, 2]
        assert hook.seen == [(1, True, 0, 2), (2, True, 0, 4), (3, True, 0, 3)]
        assert server.completer.tasks == 3

        hook.seen.clear()
        status, answer = server.post("/completion", {"prompt": [5, 6, 7, 8, 9], "n_predict": 1})
        assert status == 200, answer
        assert hook.seen == [(4, True, 0, 5)]  # the next request's task follows the embedding's last

        hook.seen.clear()
        status, answer = server.post("/embedding", {"content": "a cat"})  # one input: one task
        assert status == 200, answer
        assert [row[0] for row in hook.seen] == [5]
        (idle,) = json.loads(server.request("GET", "/slots")[2])
        assert (idle["id_task"], idle["is_processing"]) == (-1, False)
    finally:
        server.close()


def test_a_refused_embedding_takes_no_task(runtime):
    server = Served(runtime, ServeDefaults(max_tokens=2))
    try:
        status, answer = server.post("/v1/embeddings", {"input": [[5, 6], []]})
        assert status == 400, answer
        assert server.completer.tasks == 0
        status, answer = server.post("/v1/embeddings", {"input": [[5], [6]]})
        assert status == 200, answer
        assert server.completer.tasks == 2
    finally:
        server.close()
