"""README.md is the user's contract: what it names exists, with that spelling and meaning (review 48).

Each test reads README.md as text and checks one kind of name in it against the code as it is: repository paths,
the options written after ``edgesdk <command>``, ``$EDGESDK_*`` variables, the benchmark commands' ``-k`` filters,
the recipe table, the HTTP routes, the defaults it states, the Python API's settings, and the install and test
commands at the top against ``.ci/run``. Nothing here depends on where the checkout or the temporary directory lies.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import click
import pytest

from edgesdk.cli import main

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text(encoding="utf-8")
# Inline code spans (a span may wrap over a line break, as Markdown allows) and the lines of fenced code blocks
FENCED = re.findall(r"```[a-z]*\n(.*?)```", README, re.S)
SPANS = re.findall(r"`([^`]+)`", re.sub(r"```[a-z]*\n.*?```", "", README, flags=re.S))
TEXT = " ".join(README.split())  # whitespace runs made single spaces: sentences wrap over lines


def _words(text: str) -> str:
    return " ".join(text.split())


def _readme_commands() -> list[str]:
    """Every ``edgesdk ...`` command line the README writes: inline spans and fenced-block lines."""
    lines = [_words(span) for span in SPANS]
    lines += [_words(line) for block in FENCED for line in block.splitlines()]
    return [line for line in lines if line.startswith("edgesdk ")]


def _option_names(command: click.Command) -> set[str]:
    names = {"--help", "-h"}
    for param in command.params:
        if isinstance(param, click.Option):
            names.update(param.opts)
            names.update(param.secondary_opts)
    return names


def test_every_repository_path_the_readme_names_exists():
    """`tests/...`, `edgesdk/...`, `export/...` and `targets/...` paths (globs aside) name files that exist."""
    named = set(re.findall(r"(?<![\w./-])((?:tests|edgesdk|export|targets)/[\w./-]*\w)", README))
    missing = sorted(path for path in named if "*" not in path and not (ROOT / path.split("::")[0]).exists())
    assert not missing, f"README.md names paths that do not exist in the repository: {missing}"


def test_every_option_the_readme_writes_after_an_edgesdk_command_is_one_of_its_options():
    """``edgesdk run BUNDLE ... --stats``: each option written there is an option of that (sub)command."""
    commands = _readme_commands()
    assert len(commands) > 20, "the README's edgesdk command lines were not found"
    unknown = []
    for line in commands:
        words = line.split()
        command, index = main, 1
        while isinstance(command, click.Group) and index < len(words) and words[index] in command.commands:
            command, index = command.commands[words[index]], index + 1
        if isinstance(command, click.Group):  # `edgesdk thermal sensors\|plan\|report`: each named subcommand exists
            if index < len(words) and not words[index].startswith("-"):
                unknown += [f"{line}: no subcommand {name!r}" for name in re.split(r"\\?\|", words[index])
                            if name and name not in command.commands]
            continue
        known = _option_names(command)
        unknown += [f"{line[:80]}: {option}" for option in
                    re.findall(r"(?<![\w.-])(--?[A-Za-z][\w-]*)", " ".join(words[index:])) if option not in known]
    assert not unknown, f"README.md gives edgesdk commands options they do not have: {unknown}"


def test_every_edgesdk_variable_the_readme_names_is_read_by_the_code_or_its_benchmarks():
    named = set(re.findall(r"EDGESDK_[A-Z0-9_]+", README))
    sources = [path for folder in ("edgesdk", "export", "tests") for path in (ROOT / folder).rglob("*.py")]
    text = "\n".join(path.read_text(encoding="utf-8") for path in sources)
    unread = sorted(name for name in named if not re.search(rf"\b{name}\b", text))
    assert not unread, f"README.md names environment variables nothing reads: {unread}"


def _benchmark_commands() -> list[tuple[tuple[str, ...], str, str | None]]:
    """(variables set, test file, -k expression or None) of each ``python -m pytest tests/... `` command."""
    found = []
    for match in re.finditer(r"((?:EDGESDK_[A-Z0-9_]+=\S+ )*)python -m pytest (tests/\S+\.py)([^`;)]*)", TEXT):
        variables = tuple(re.findall(r"(EDGESDK_[A-Z0-9_]+)=", match[1]))
        k = re.search(r"-k (\"[^\"]+\"|\S+)", match[3])
        found.append((variables, match[2], k[1].strip('"') if k else None))
    return found


def test_every_benchmark_command_selects_a_test_and_sets_variables_its_file_reads():
    """A `-k` filter the README gives selects at least one test of that file, matched as pytest matches it (a
    case-insensitive part of the test's name, its file's name or a folder's), and each `EDGESDK_*=DIR` set before it
    is read by the file or the benchmarks' conftest. The tests are read from the source, not collected: collecting
    imports llama-cpp-python and torch, which are not everywhere."""
    from _pytest.mark.expression import Expression

    commands = _benchmark_commands()
    assert len(commands) > 20, "the README's benchmark commands were not found"
    problems = []
    for variables, file, expression in commands:
        path = ROOT / file
        source = path.read_text(encoding="utf-8")
        conftest = (path.parent / "conftest.py").read_text(encoding="utf-8") if (path.parent / "conftest.py").exists() \
            else ""
        problems += [f"{file} does not read {name}" for name in variables if name not in source + conftest]
        if expression is None:
            continue
        tests = [node.name for node in ast.walk(ast.parse(source))
                 if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test")]
        compiled, folders = Expression.compile(expression), tuple(file.split("/"))
        selected = [name for name in tests if compiled.evaluate(
            lambda word, parts=(name, *folders): any(word.lower() in part.lower() for part in parts))]
        if not selected:
            problems.append(f"-k {expression!r} selects none of {file}'s tests {tests}")
    assert not problems, f"README.md's benchmark commands: {problems}"


def test_every_k_filter_the_readme_gives_alone_selects_a_benchmark():
    """A filter written on its own (``(`-k decode_speed`)``, ``(`... -k title```) refers to the benchmark the
    sentence names; it selects at least one test of the benchmarks."""
    from _pytest.mark.expression import Expression

    filters = [match[1].strip('"') for span in SPANS
               if (match := re.fullmatch(r"(?:\.\.\. )?-k (\"[^\"]+\"|\S+)", _words(span)))]
    assert len(filters) >= 4, "the README's -k filters were not found"
    tests = [(node.name, path.name) for path in sorted((ROOT / "tests" / "benchmarks").glob("test_*.py"))
             for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
             if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test")]
    unmatched = [expression for expression in filters if not any(Expression.compile(expression).evaluate(
        lambda word, names=names: any(word.lower() in part.lower() for part in names)) for names in tests)]
    assert not unmatched, f"README.md's -k filters select no benchmark: {unmatched}"


def test_the_recipe_table_lists_the_shipped_recipes():
    from edgesdk.build.recipes import shipped_recipes

    table = README.split("| recipe | stages | graph and weights |", 1)[1].split("\n\n", 1)[0]
    listed = re.findall(r"^\| `([\w-]+)`", table, re.M)
    assert sorted(listed) == sorted(shipped_recipes()), \
        f"README.md's recipe table lists {sorted(listed)}; edgesdk/recipes holds {sorted(shipped_recipes())}"


def test_the_readme_targets_are_shipped_profiles():
    from edgesdk.profile import get_profile

    named = set(re.findall(r"--(?:thermal-)?target ([a-z][\w-]+)", TEXT)) - {"T"}
    assert named, "the README's --target values were not found"
    for name in sorted(named):
        get_profile(name)  # raises naming the profiles where the name is none of them


def test_every_route_the_server_lists_is_in_the_readme_and_every_route_the_readme_names_is_served():
    from edgesdk.serve.http_server import ROUTES

    served = set(re.findall(r"(/[\w/{}.-]*)", ROUTES)) | {"/v1/models/{id}"}
    spans = {span.split()[-1] for span in SPANS if re.fullmatch(r"(?:(?:GET|POST|DELETE) )?/[\w/{}.-]+", span)}
    named = {span for span in spans if span.startswith(("/v1/", "/api/")) or span in served}
    unserved = sorted(route for route in named if route not in served and "/v1" + route not in served)
    undocumented = sorted(route for route in served if f"`{route}`" not in README and f" {route}`" not in README)
    assert not unserved, f"README.md names routes edgesdk serve does not answer: {unserved}"
    assert not undocumented, f"edgesdk serve answers routes README.md does not name: {undocumented}"


# (command, option's parameter name, the default README.md states, a phrase of README.md that states it)
STATED_DEFAULTS = [
    (("build",), "max_context", 4096, "`--max-context N` (the graph's context, default 4096"),
    (("serve",), "port", 8080, "on `127.0.0.1:8080`"),
    (("serve",), "listen_host", "127.0.0.1", "on `127.0.0.1:8080`"),
    (("serve",), "max_new_tokens", 512, "the server's `--max-new-tokens` (512)"),
    (("serve",), "max_queue", 8, "`--max-queue` (8) may wait"),
    (("serve",), "cache_ram_mib", 256, "(`--cache-ram MIB`, 256 by default"),
    (("serve",), "batch_size", 2048, "`serve -b/--batch-size N` (2048)"),
    (("serve",), "responses_kept", 256, "the last 256 within 16 MiB of JSON"),
    (("serve",), "responses_kept_mib", 16, "the last 256 within 16 MiB of JSON"),
    (("serve",), "reasoning_format", "auto", "`--reasoning-format auto` (the default)"),
    (("run",), "draft_max", 2, "`--draft-max N`, default 2"),
    (("run",), "draft_p_min", 0.0, "`--draft-p-min P`, default 0"),
    (("bench",), "prompt_tokens", 512, "[-p 512] [-n 128] [-pg PP,TG] [-r 5]"),
    (("bench",), "new_tokens", 128, "[-p 512] [-n 128] [-pg PP,TG] [-r 5]"),
    (("bench",), "repetitions", 5, "[-p 512] [-n 128] [-pg PP,TG] [-r 5]"),
    (("eval",), "context", 512, "(`--max-chars 0`: all), context 512"),
    (("eval",), "max_chars", 200_000, "over the first 200,000 characters (`--max-chars 0`: all)"),
    (("eval",), "hellaswag_tasks", 400, "HellaSwag scores `--hellaswag-tasks` (400) tasks"),
    (("eval",), "winogrande_tasks", 0, "N tasks drawn as llama.cpp draws them (0, the default: all"),
    (("deploy",), "remote_root", "~/edgesdk", "`--remote-root` (default `~/edgesdk`)"),
    (("deploy",), "smoke_timeout", 900, "`--smoke-timeout SECONDS` (default 900"),
    (("deploy",), "jobs", 4, "The default of 4 is there because every board uploads"),
    (("thermal", "plan"), "minutes", 30, "with `--minutes 30 --ambient 35`"),
]


@pytest.mark.parametrize(("path", "name", "stated", "phrase"), STATED_DEFAULTS,
                         ids=[f"{' '.join(path)}-{name}" for path, name, _, _ in STATED_DEFAULTS])
def test_a_default_the_readme_states_is_the_commands(path, name, stated, phrase):
    command = main
    for word in path:
        command = command.commands[word]
    params = {param.name: param for param in command.params}
    assert phrase in TEXT, f"README.md no longer says {phrase!r}: update this test with the README"
    default = _default(params[name])
    assert default == stated, \
        f"README.md says {phrase!r}, but 'edgesdk {' '.join(path)}' defaults {name} to {default!r}"


def _default(param):
    """A parameter's default; a repeatable option (llama-bench's lists, ``bench -p 128,256 -p 512``) has none of its
    own in click, and the command takes the one its help states as ``[default: N]`` where it is not given."""
    if not getattr(param, "multiple", False) or param.default not in (None, ()) and \
            type(param.default).__name__ != "Sentinel":
        return param.default
    found = re.search(r"\[default: (-?\d+)\]", param.help or "")
    return int(found[1]) if found else param.default


def test_every_setting_load_takes_is_named_in_the_readme():
    """README's From Python: ``settings`` are what a request that leaves a field out gets; each one ``load`` takes
    (``api_checks.MODEL_SETTINGS``) is listed there, so none is found only by reading the code."""
    from edgesdk.api_checks import MODEL_SETTINGS

    listing = TEXT.split("`settings` are what a request that leaves a field out gets", 1)[1].split("- `tokenize(", 1)[0]
    missing = [name for name in MODEL_SETTINGS if f"`{name}`" not in listing]
    assert not missing, f"README.md's list of load() settings leaves out {missing}"


def test_the_stop_limit_the_readme_states_is_the_routes():
    """Chat takes OpenAI's 4 stop strings; /v1/completions any number, as llama-server (review 48: the README said
    "up to 4" for both)."""
    from edgesdk.serve.api import MAX_STOP_SEQUENCES, ApiError, parse_chat_request, parse_text_request

    stops = [f"stop {index}" for index in range(MAX_STOP_SEQUENCES + 1)]
    assert len(parse_text_request({"prompt": "x", "stop": stops}).stop) == len(stops)
    with pytest.raises(ApiError, match=f"at most {MAX_STOP_SEQUENCES}"):
        parse_chat_request({"messages": [{"role": "user", "content": "x"}], "stop": stops})
    sentence = TEXT.split("`stop` strings", 1)[1].split("(cut from the answer", 1)[0]
    said = f"README.md's Sampling does not say which routes take how many stop strings: {sentence!r}"
    assert f"up to {MAX_STOP_SEQUENCES} on chat" in sentence, said
    assert "any number on `/v1/completions`" in sentence, said


def test_every_anthropic_thinking_type_the_server_takes_is_in_the_readme():
    """The Messages API's ``thinking`` takes enabled, adaptive, between_tools and disabled (Anthropic's SDK's
    ThinkingConfigParam); the README's sentence on that field names each."""
    from edgesdk.serve import anthropic

    taken = [kind for kind, value in [("enabled", {"type": "enabled", "budget_tokens": 1024}),
                                      ("adaptive", {"type": "adaptive"}), ("between_tools", {"type": "between_tools"}),
                                      ("disabled", {"type": "disabled"})] if anthropic._thinking(value) is not None]
    assert taken == ["enabled", "adaptive", "between_tools", "disabled"]
    sentence = TEXT.split("`thinking` field (", 1)[1].split(")", 1)[0]
    missing = [kind for kind in taken if f"`{kind}`" not in sentence]
    assert not missing, f"README.md's Messages API thinking field leaves out {missing}: {sentence!r}"


def test_every_recipe_the_readme_writes_out_loads(tmp_path):
    """A recipe written inline (``{name: ..., stages: [...], export: {...}}``) is one ``--recipe FILE.yaml`` takes."""
    from edgesdk.build.recipes import load_recipe

    recipes = [_words(span) for span in SPANS if span.lstrip().startswith("{") and "stages:" in span]
    assert recipes, "the README's inline recipes were not found"
    for index, text in enumerate(recipes):
        path = tmp_path / f"r{index}.yaml"
        path.write_text(text + "\n", encoding="utf-8")
        load_recipe(str(path)).validated()  # a BuildError names what is missing or wrong


def test_the_commands_at_the_top_are_what_ci_runs():
    """The README's install-and-test line installs what .ci/run installs (torch pinned first, then the host and dev
    extras) and runs the same pytest, and its first line builds and runs the default bundle where build puts it."""
    from edgesdk.build.pipeline import default_out
    from edgesdk.models.sources import DEFAULT_MODEL

    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    top = FENCED[0].splitlines()
    build_line = next(line for line in top if "edgesdk build" in line)
    test_line = next(line for line in top if "pytest" in line)
    torch_pin = re.search(r"torch==[\w.]+", ci)[0]
    assert torch_pin in build_line
    assert torch_pin in test_line
    assert "pip install --quiet -e '.[host,dev]'" in ci
    assert "pip install -e '.[host,dev]'" in test_line
    ci_pytest = re.search(r"^python -m pytest(.*)$", ci, re.M)[1].replace(" -q", "").split()
    assert test_line.split("python -m pytest", 1)[1].split() == ci_pytest
    target = re.search(r"edgesdk build --target (\S+)", build_line)[1]
    assert f"edgesdk run {default_out(DEFAULT_MODEL, target).as_posix()} " in build_line
