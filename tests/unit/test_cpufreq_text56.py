"""Clock cap and chat rendering, review 56 (edgesdk/thermal/cpufreq.py, edgesdk/runtime/text.py)."""

from __future__ import annotations

import json
import os

import pytest

from edgesdk.errors import BundleError
from edgesdk.runtime.text import ChatTokenizer
from edgesdk.thermal.cpufreq import CpuFreqCap
from tests._utils.sysfs import make_cpufreq_policy

# --- the clock cap: a kernel that keeps another value than the one written -----------------------------------

TOP, LOW = 2_400_000, 1_500_000


class RoundingKernel(CpuFreqCap):
    """A cap over a fake sysfs tree whose scaling_max_freq keeps what the kernel would: each written value rounded
    down to the nearest 200 MHz step, as a table driver resolves a value between two of its frequencies."""

    def _write(self, policy, value, held_khz=None):
        written = super()._write(policy, value, held_khz)
        if written:
            policy.max_file.write_text(f"{value // 200_000 * 200_000}\n")
        return written


def ceiling(policy) -> int:
    return int((policy / "scaling_max_freq").read_text())


def test_a_cap_the_kernel_stores_rounded_is_still_given_back(tmp_path):
    """No table (so the cap is ratio x the ceiling, 1_800_001 kHz here) and a kernel that keeps 1_800_000: the next
    pass read the file, saw another value than the one written, took it for someone else's write and left the policy
    capped for good, with a warning that blamed "someone else". The value the kernel kept is the cap now."""
    policy = make_cpufreq_policy(tmp_path, 0, TOP, LOW)
    state = tmp_path / "cache" / "clock-cap.json"
    warnings = []
    cap = RoundingKernel(tmp_path, state, warn=warnings.append)
    cap.set_ratio(1_800_001 / TOP)
    assert ceiling(policy) == 1_800_000
    assert json.loads(state.read_text())[str(policy / "scaling_max_freq")]["written"] == 1_800_000

    cap.set_ratio(1_600_000 / TOP)  # a lower cap: still this run's policy
    assert ceiling(policy) == 1_600_000
    cap.close()
    assert ceiling(policy) == TOP
    assert warnings == []
    assert not state.exists()


def test_a_run_killed_while_the_kernel_holds_a_rounded_cap_is_undone_by_the_next(tmp_path):
    """The state file records the value the kernel kept: the next run's recovery found the file at another value than
    the recorded one, read it as a setting made since and left the cap until a reboot."""
    policy = make_cpufreq_policy(tmp_path, 0, TOP, LOW)
    state = tmp_path / "cache" / "clock-cap.json"
    cap = RoundingKernel(tmp_path, state)
    cap.set_ratio(1_700_001 / TOP)
    assert ceiling(policy) == 1_600_000
    cap._lock.close()  # the process is killed: its lock goes, its cap and state file stay
    notes = CpuFreqCap(tmp_path, state).notes
    assert ceiling(policy) == TOP
    assert "restored policy0 scaling_max_freq" in notes[0]


# --- chat rendering: continuing a final assistant message that is not a plain string -------------------------

# a ChatML template that writes a message's content whether it is a string or a list of text parts
PARTS_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{% if m['content'] is string %}"
                  "{{ m['content'] }}{% else %}{% for p in m['content'] %}{{ p['text'] }}{% endfor %}{% endif %}"
                  "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
USER = {"role": "user", "content": "hi"}
OPENED = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


@pytest.fixture(scope="module")
def chat(tmp_path_factory):
    pytest.importorskip("transformers")
    from tests._utils import tiny

    folder = tmp_path_factory.mktemp("chat56")
    tiny.tiny_tokenizer().save_pretrained(folder)
    (folder / "chat_template.jinja").write_text(PARTS_TEMPLATE, encoding="utf-8")
    return ChatTokenizer(folder / "tokenizer.json", {}, folder / "chat_template.jinja")


def test_a_final_message_of_text_parts_is_continued_from_its_last_text(chat):
    """A list of parts raised TypeError ("can only concatenate list (not "str") to list"); transformers'
    continue_final_message goes on from the last part with a text, as here."""
    parts = [{"type": "text", "text": "Well, "}, {"type": "text", "text": "sure: "}]
    rendered = chat.render_chat([USER, {"role": "assistant", "content": parts}], continue_final=True)
    assert rendered == OPENED + "Well, sure: "
    assert parts[-1]["text"] == "sure: "  # the caller's message is left as it was


def test_a_final_message_with_no_content_leaves_the_generation_prompt(chat):
    """content None raised AttributeError ('NoneType' object has no attribute 'strip'): no text, as an empty one."""
    rendered = chat.render_chat([USER, {"role": "assistant", "content": None}], continue_final=True)
    assert rendered == OPENED


def test_a_final_message_without_text_or_no_message_at_all_is_refused_by_name(chat):
    with pytest.raises(BundleError, match="holds no text for the answer to go on from"):
        chat.render_chat([USER, {"role": "assistant", "content": [{"type": "image_url"}]}], continue_final=True)
    with pytest.raises(BundleError, match="there are no messages"):  # was IndexError: list index out of range
        chat.render_chat([], continue_final=True)


# --- the clock cap: a cluster offline when the run starts, a write that fails ---------------------------------

TABLE = [115_200, 1_190_400, 1_497_600, 1_907_200]


def test_a_cluster_offline_at_the_start_is_capped_once_it_is_back(tmp_path):
    """An nvpmodel mode with fewer cores at the start, the full mode set during the run: the policy was skipped at
    discovery and never capped for the whole run, though a cluster that goes down during a run is capped once back."""
    make_cpufreq_policy(tmp_path, 0, 1_907_200, 115_200, TABLE)
    second = make_cpufreq_policy(tmp_path, 4, 1_907_200, 115_200, TABLE)
    (second / "affected_cpus").write_text("\n")  # the 4-core mode: CPUs 4-7 offline
    now = [0.0]
    warnings = []
    cap = CpuFreqCap(tmp_path, warn=warnings.append, clock=lambda: now[0])
    cap.set_ratio(0.625)
    assert ceiling(second) == 1_907_200  # never written while it is offline

    (second / "affected_cpus").write_text("4 5 6 7\n")  # the mode with every core
    now[0] += 2.0
    cap.set_ratio(0.625)
    assert ceiling(second) == 1_497_600
    cap.close()
    assert ceiling(second) == 1_907_200
    assert warnings == []


# a kernel file that reads as a number and that no one, root included, may write (mode 0444 sysctl)
READ_ONLY_NUMBER = "/proc/sys/kernel/ngroups_max"


@pytest.mark.skipif(not os.path.exists(READ_ONLY_NUMBER), reason="needs Linux /proc/sys")
@pytest.mark.parametrize("capped_first", [False, True])
def test_a_failed_write_says_what_to_do(tmp_path, capped_first):
    """A write to scaling_max_freq fails: the warning gave the error and "the clock cap stops", no fix (nor the value
    it wrote). A first cap says what lets --clock-cap act; a cap left in place says how to give the ceiling back now."""
    held = int(open(READ_ONLY_NUMBER).read())
    top = 4 * held
    policy = make_cpufreq_policy(tmp_path, 0, top, held // 4, [held // 4, held // 2, held, top])
    warnings = []
    cap = CpuFreqCap(tmp_path, warn=warnings.append)
    if capped_first:
        cap.set_ratio(0.25)
        assert ceiling(policy) == held
    (policy / "scaling_max_freq").unlink()
    (policy / "scaling_max_freq").symlink_to(READ_ONLY_NUMBER)  # reads `held`; no write takes
    cap.set_ratio(0.125 if capped_first else 0.25)
    assert len(warnings) == 1
    if capped_first:
        assert f"cannot write {held // 2} kHz to scaling_max_freq" in warnings[0]
        assert f"or give it back yourself: echo {top} | sudo tee {policy / 'scaling_max_freq'}" in warnings[0]
    else:
        assert f"cannot write {held // 4} kHz to scaling_max_freq" in warnings[0]
        assert "the clock cap stops; for --clock-cap to act, " in warnings[0]
