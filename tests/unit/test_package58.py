"""Review of the bundle writer (edgesdk/build/package.py): a bundle the disk has no room for."""

from __future__ import annotations

import pytest

from tests._utils.child_script import script_outcome

pytest.importorskip("torch")
pytest.importorskip("resource")

# A build of a tiny random model with no stages that keeps its work directory, then the same build resumed (its export
# taken from the work directory) in a process whose files may not grow past a few kilobytes (RLIMIT_FSIZE, with
# SIGXFSZ ignored: the write fails with EFBIG as a full disk's fails with ENOSPC): the bundle's copy of the weights is
# the first file past that. Prints what the resumed build raised.
SMALL_DISK_BUNDLE = """
import json, resource, shutil, signal, sys
from pathlib import Path
from edgesdk.build.pipeline import BuildConfig, build
from edgesdk.export.onnx_export import ExportConfig
from tests._utils.tiny import save_tiny_model_dir

root, terms, codec = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
save_tiny_model_dir(root / "model", hidden=64, heads=4, kv_heads=2)
(root / "recipe.yaml").write_text("name: tiny-fp32\\nstages: []\\n"
                                  f"export: {{form: ort-fused, weights: fp32, weights_codec: {codec}}}\\n")

def config(**options):
    return BuildConfig(target="host", model=str(root / "model"), out=root / "b", recipe=str(root / "recipe.yaml"),
                       export=ExportConfig(max_context=64), progress=False, terms=terms, **options)

build(config(keep_work=True))
shutil.rmtree(root / "b")
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (20_000, 20_000))
try:
    build(config(resume=True))
    print(json.dumps({"raised": None}))
except Exception as exc:
    print(json.dumps({"raised": type(exc).__name__, "problem": getattr(exc, "problem", str(exc)),
                      "fix": getattr(exc, "fix", None)}))
"""


@pytest.mark.parametrize(("terms", "codec", "resume", "named"),
                         [("cli", "none", "--resume", " (its file model.onnx.data)"),
                          ("python", "zlib", "resume=True", "")])  # zlib: a write(), whose error names no file
def test_a_bundle_the_disk_refuses_is_a_build_error_naming_it_and_how_to_resume(tmp_path, terms, codec, resume,
                                                                                 named):
    """It was a bare ``OSError: [Errno 27] File too large`` (``[Errno 28] No space left on device`` on a full disk)
    traceback from shutil, naming the staging directory's copy of the weights and no fix."""
    outcome = script_outcome(SMALL_DISK_BUNDLE, str(tmp_path), terms, codec)
    assert outcome["raised"] == "BuildError", outcome
    assert outcome["problem"].startswith(f"cannot write the bundle {tmp_path / 'b'}{named}: File too large (")
    assert outcome["problem"].endswith(" free on its disk)")
    assert outcome["fix"].startswith(f"free space on the disk holding {tmp_path}, then run the build again with "
                                     f"{resume}: the export is kept")
    assert not (tmp_path / "b").exists()
    assert not (tmp_path / ".b.partial").exists()  # the staged copy of the weights gives its space back
    assert (tmp_path / "b.build" / "export" / "model.onnx.data").is_file()  # what the resumed build takes


@pytest.mark.parametrize(("stage", "values", "where"),
                         [("power", {"weights": [True, 0.5, 0.25]}, "item 0 is "),
                          ("power", {"peak_layers": [-1, True]}, "item 1 is "),
                          ("power", {"sweep": [[0.2, 0.5, 0.3], [0.1, False, 0.4]]}, "item 1 of item 1 is "),
                          ("qat", {"steps": True}, "")])
def test_a_true_false_value_in_a_list_of_numbers_is_refused_naming_the_item(stage, values, where):
    """A bare ``true`` for a number was refused, but one in a list of numbers (YAML's ``on`` / ``yes`` read as true)
    was taken as 1 (``power.weights=[true, 0.5, 0.25]`` became (1.0, 0.5, 0.25)) by pydantic's lax mode."""
    from edgesdk.build.registry import make_config
    from edgesdk.errors import BuildError

    with pytest.raises(BuildError) as raised:
        make_config(stage, values)
    assert f"({where}a true/false value where a number or a name is expected)" in raised.value.problem
    key = next(iter(values))
    assert f"stage '{stage}' option {key}=" in raised.value.problem
    assert f"--set {stage}.{key}=" in raised.value.fix


def test_a_true_false_option_still_takes_true():
    from edgesdk.build.registry import make_config

    assert make_config("qat", {"train_embedding": True}).train_embedding is True
