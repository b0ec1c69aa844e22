"""edgesdk bench's conditions (runtime/bench_conditions.py) and run's -f / --ignore-eos, on unusual boards and inputs."""

from __future__ import annotations

import os
import threading

from edgesdk.runtime.bench_conditions import snapshot, warnings
from tests._utils.sysfs import make_cpufreq_policy
from tests.unit.test_cli import assert_ok, invoke


def test_run_reads_the_prompt_from_a_pipe(tiny_bundle, tmp_path):
    """llama-cli's -f reads what it is given, a pipe too: `run -f <(cmd)` or `-f /dev/stdin` gives a prompt of
    several lines from a command (piped lines without -f are each a prompt of their own)."""
    text = "first line\nsecond line\n"
    fifo = tmp_path / "prompt.fifo"
    os.mkfifo(fifo)

    def write() -> None:
        with open(fifo, "w", encoding="utf-8") as out:  # blocks until a reader opens the pipe
            out.write(text)

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    try:
        from_pipe = invoke("run", tiny_bundle.path, "-f", fifo, "--raw", "-n", 8, "--threads", 1)
    finally:  # a run that never opened the pipe leaves the writer waiting for a reader: be that reader
        reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
        writer.join(timeout=10)
        os.close(reader)
    assert_ok(from_pipe)
    # -f drops the last newline, as llama-cli does
    given = invoke("run", tiny_bundle.path, "--prompt", text[:-1], "--raw", "-n", 8, "--threads", 1)
    assert_ok(given)
    assert from_pipe.stdout == given.stdout
    missing = invoke("run", tiny_bundle.path, "-f", tmp_path / "none.txt")
    assert missing.exit_code == 2, missing.output
    assert "is not a file (nothing exists at that path)" in missing.output


def test_run_history_beside_a_prompt_file_names_the_file(tiny_bundle, tmp_path):
    path = tmp_path / "prompt.txt"
    path.write_text("hello\n", encoding="utf-8")
    result = invoke("run", tiny_bundle.path, "-f", path, "--history", "-n", 2, "--threads", 1)
    assert_ok(result)
    assert "--history is not used: --file answers one prompt" in result.stderr
    result = invoke("run", tiny_bundle.path, "--prompt", "hello", "--history", "-n", 2, "--threads", 1)
    assert_ok(result)
    assert "--history is not used: --prompt answers one prompt" in result.stderr


def _policy(root, index: int, driver: str, governor: str = "powersave"):
    policy = make_cpufreq_policy(root, index, 4_700_000, 800_000)
    (policy / "scaling_governor").write_text(governor + "\n")
    (policy / "scaling_driver").write_text(driver + "\n")
    (policy / "affected_cpus").write_text(f"{index}\n")
    return policy


def test_powersave_of_an_active_pstate_driver_is_no_warning(tmp_path):
    """intel_pstate and amd-pstate-epp in active mode offer only performance and powersave, and their powersave
    follows the load (kernel intel_pstate.rst, amd-pstate.rst): it is the default of most x86 hosts, not a
    clock held at its lowest, and schedutil is not among their governors."""
    for index in range(2):
        _policy(tmp_path, index, "intel_pstate")
    taken = snapshot([], tmp_path / "none", tmp_path, use_jtop=False)
    assert not [w for w in warnings(taken, taken, cores=64) if "powersave" in w]
    assert taken["cpufreq_driver"] == "intel_pstate"
    passive = tmp_path / "passive"
    _policy(passive, 0, "intel_cpufreq")  # intel_pstate in passive mode: the generic governors, powersave the lowest
    taken = snapshot([], tmp_path / "none", passive, use_jtop=False)
    assert any("policy0 (cpus 0) runs the powersave governor" in w for w in warnings(taken, taken, cores=64))
