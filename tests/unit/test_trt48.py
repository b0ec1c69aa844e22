"""TensorRT engine builder, review 48: where the engine is written, why an engine is refused, and what deploy says
of a board whose edgesdk cannot build.

TensorRT is not installed here: ``build_engine`` runs against a stand-in of TensorRT 10's build API that parses the
bundle's real ONNX graph with ``onnx`` (its inputs, outputs and the shape tensor ``num_logits_to_keep``) and counts
the builds; everything around it (bundle verification, the profile, the plan, engine.json, the directory commit)
is the product's own code. Real builds: tests/gpu/test_tensorrt.py.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from edgesdk.cli import main
from edgesdk.errors import RuntimeBackendError
from edgesdk.runtime import tensorrt_engine as te
from tests._utils.tensorrt_standin import TensorRTModule


class BuildingTensorRT(TensorRTModule):
    """``tensorrt`` as far as :func:`te.build_engine` uses it (TensorRT 10 Python API names)."""

    class NetworkDefinitionCreationFlag:
        EXPLICIT_BATCH, STRONGLY_TYPED = 0, 5

    class MemoryPoolType:
        WORKSPACE = "workspace"

    class BuilderFlag:
        FP16, INT8, SPARSE_WEIGHTS = "fp16", "int8", "sparse_weights"

    def __init__(self):
        import onnx

        self.builds = 0
        trt = self

        class Tensor:
            def __init__(self, value_info):
                tensor_type = value_info.type.tensor_type
                self.name = value_info.name
                self.shape = [d.dim_value if d.HasField("dim_value") else -1 for d in tensor_type.shape.dim]
                self.dtype = onnx.TensorProto.DataType.Name(tensor_type.elem_type)
                self.is_shape_tensor = value_info.name == "num_logits_to_keep"  # it feeds a Slice's starts

        class Network:
            def __init__(self):
                self.inputs, self.outputs = [], []

            num_inputs = property(lambda self: len(self.inputs))
            num_outputs = property(lambda self: len(self.outputs))

            def get_input(self, index):
                return self.inputs[index]

            def get_output(self, index):
                return self.outputs[index]

        class OnnxParser:
            num_errors = 0

            def __init__(self, network, logger):
                self.network = network

            def parse_from_file(self, path):
                graph = onnx.load(path, load_external_data=False).graph
                self.network.inputs = [Tensor(v) for v in graph.input]
                self.network.outputs = [Tensor(v) for v in graph.output]
                return True

        class Profile:
            def set_shape(self, name, low, opt, high):
                assert all(lo <= o <= hi for lo, o, hi in zip(low, opt, high, strict=True)), name

            def set_shape_input(self, name, low, opt, high):
                assert all(lo <= o <= hi for lo, o, hi in zip(low, opt, high, strict=True)), name

        class TimingCache:
            def serialize(self):
                return b"timings"

        class Config:
            def set_memory_pool_limit(self, pool, size):
                pass

            def set_flag(self, flag):
                pass

            def add_optimization_profile(self, profile):
                return 0

            def create_timing_cache(self, data):
                return TimingCache()

            def set_timing_cache(self, cache, ignore_mismatch):
                return True

            def get_timing_cache(self):
                return TimingCache()

        class Builder:
            def __init__(self, logger):
                pass

            def create_network(self, flags):
                return Network()

            def create_builder_config(self):
                return Config()

            def create_optimization_profile(self):
                return Profile()

            def build_serialized_network(self, network, config):
                trt.builds += 1
                return f"engine {trt.builds}".encode()

        self.OnnxParser, self.Builder = OnnxParser, Builder


@pytest.fixture(scope="module")
def standard_bundle(tiny_model_dir, tmp_path_factory):
    from edgesdk.build.pipeline import BuildConfig, build
    from edgesdk.export.onnx_export import ExportConfig

    return build(BuildConfig(target="orin-nano-8gb", model=str(tiny_model_dir), recipe="fp32-standard",
                             out=tmp_path_factory.mktemp("trt48") / "tiny-orin", export=ExportConfig(max_context=16),
                             progress=False))


@pytest.fixture
def tensorrt(tmp_path, monkeypatch):
    """The stand-in TensorRT on an Orin Nano (sm_87, JetPack 6.2), the user cache in tmp."""
    monkeypatch.setenv("EDGESDK_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv(te.ENGINE_DIR_ENV, raising=False)
    standin = BuildingTensorRT()
    monkeypatch.setitem(sys.modules, "tensorrt", standin)
    monkeypatch.setattr(te, "require_sm", lambda *target: 87)
    monkeypatch.setattr(te, "board_jetpack", lambda: "6.2")
    monkeypatch.setattr(te, "board_module", lambda: "orin-nano-8gb")
    return standin


def test_engine_build_out_dot_rebuilds_the_engine_directory_one_stands_in(standard_bundle, tensorrt, tmp_path,
                                                                           monkeypatch):
    """``cd engines/ID/KEY; edgesdk engine build BUNDLE --out . --force`` built the engine and then failed with
    ValueError("PosixPath('.') has an empty name") writing it beside '.', losing the build."""
    engine = tmp_path / "engines" / "key"
    first = te.build_engine(standard_bundle.path, out=engine)
    assert (engine / te.ENGINE_FILE).read_bytes() == b"engine 1"
    monkeypatch.chdir(engine)
    result = CliRunner().invoke(main, ["engine", "build", str(standard_bundle.path), "--out", ".", "--force"])
    assert result.exit_code == 0, result.output
    assert tensorrt.builds == 2
    assert result.stdout.strip() == first["path"]  # absolute: the same directory, named
    assert (engine / te.ENGINE_FILE).read_bytes() == b"engine 2"
    assert json.loads((engine / te.INFO_FILE).read_text())["engine_bytes"] == len(b"engine 2")
    assert sorted(p.name for p in engine.parent.iterdir()) == ["key"]  # nothing staged is left beside it
    monkeypatch.chdir(tmp_path / "engines")  # and a relative --out with '..' is the directory it names
    again = te.build_engine(standard_bundle.path, out=Path("key/../key"), force=True)
    assert again["path"] == first["path"]
    assert (engine / te.ENGINE_FILE).read_bytes() == b"engine 3"


def test_an_out_that_cannot_be_written_is_refused_before_the_build(standard_bundle, tensorrt, tmp_path):
    """A place the engine cannot be written (here a file where a directory is asked for; also another user's deploy
    root or a read-only mount) was found only after the minutes of the build, as an OSError traceback (no
    RuntimeBackendError, so no 'error:' line and fix) that lost the engine."""
    blocked = tmp_path / "a-file"
    blocked.write_text("not a directory")
    with pytest.raises(RuntimeBackendError, match="cannot write the TensorRT engine directory") as info:
        te.build_engine(standard_bundle.path, out=blocked / "engine")
    assert tensorrt.builds == 0  # refused before building, not after
    assert "--out" in info.value.fix
    assert blocked.read_text() == "not a directory"
    with pytest.raises(RuntimeBackendError, match="cannot write the TensorRT engine"):  # the commit itself too
        te._commit(blocked / "engine", b"plan", {})


def test_an_engine_built_where_the_module_could_not_be_told_is_not_called_an_old_format(tmp_path):
    """An engine.json of format 2 records the module; None there means the builder could not tell its module
    (a container hiding /proc/device-tree). It was refused as 'an engine.json of format 2, before edgesdk keyed
    engines by module', which sends the user looking for an old edgesdk."""
    directory = tmp_path / "engine"
    directory.mkdir()
    (directory / te.ENGINE_FILE).write_bytes(b"plan")
    built = {"bundle_id": "abc", "tensorrt": "10.3.0", "sm": 87}
    why = te._mismatch(directory, {**built, "format": te.INFO_FORMAT, "module": None}, "abc", "10.3.0", 87,
                       "orin-nx-16gb")
    assert why.startswith("it was built where the module could not be told")
    assert "before edgesdk keyed engines by module" not in why
    assert why.endswith("this board is orin-nx-16gb")
    old = te._mismatch(directory, {**built, "format": 1}, "abc", "10.3.0", 87, "orin-nx-16gb")
    assert "an engine.json of format 1, before edgesdk keyed engines by module" in old
    assert te._mismatch(directory, {**built, "format": te.INFO_FORMAT, "module": None}, "abc", "10.3.0", 87,
                        None) is None  # a board that cannot tell its module either does not check it


@pytest.mark.parametrize(("stderr", "reason"), [
    ("Traceback (most recent call last):\n  File \"edgesdk/cli.py\", line 12, in <module>\n"
     "ModuleNotFoundError: No module named 'click'\n", "ModuleNotFoundError: No module named 'click'"),
    ("/usr/lib/python3/dist-packages/tensorrt/__init__.py:1: UserWarning: something\n"
     "error: TensorRT's Python module 'tensorrt' cannot be imported\n  fix: sudo apt install python3-libnvinfer\n",
     "TensorRT's Python module 'tensorrt' cannot be imported"),
])
def test_deploy_names_why_the_boards_edgesdk_cannot_build(tmp_path, stderr, reason):
    """Deploy took the first line of 'edgesdk engine check''s stderr as the reason: for a traceback that is
    'Traceback (most recent call last):', and a warning printed before edgesdk's 'error:' line hid it."""
    from edgesdk.deploy import engine
    from edgesdk.deploy.remote import Board
    from edgesdk.deploy.transport import LocalTransport

    board = Board(LocalTransport(str(tmp_path)), sys.executable, str(tmp_path))
    status = engine.builder_status(board, [sys.executable, "-c", f"import sys; sys.stderr.write({stderr!r}); "
                                                                 "sys.exit(1)"])
    assert not status.available
    assert status.reason.startswith(f"the board's edgesdk cannot use it ({reason};")
    assert "Traceback" not in status.reason
    assert "UserWarning" not in status.reason


def test_engine_build_help_names_the_timing_cache_it_uses(tensorrt, standard_bundle, tmp_path):
    """The timing cache is keyed by module too on a Jetson; --help named a file without it, which a user looking for
    it (or to share it) does not find."""
    help_text = "".join(CliRunner().invoke(main, ["engine", "build", "--help"]).output.split())
    assert "timing-trt<version>-sm<SM>-<module>.cache" in help_text
    info = te.build_engine(standard_bundle.path, out=tmp_path / "engine")
    assert Path(info["timing_cache"]).name == "timing-trt10.3.0-sm87-orin-nano-8gb.cache"
    assert Path(info["timing_cache"]).is_file()


@pytest.mark.parametrize(("errors", "said"), [
    ([], "could not parse {model}: the parser recorded no error; TensorRT's log above says why"),
    ([f"In node {i} (importSlice): UNSUPPORTED_NODE" for i in range(7)],
     "could not parse {model}: In node 0 (importSlice): UNSUPPORTED_NODE; In node 1"),
])
def test_a_graph_tensorrt_cannot_parse_says_what_the_parser_said(standard_bundle, tensorrt, tmp_path, monkeypatch,
                                                                errors, said):
    """onnx-tensorrt records no IParserError when it cannot read or decode the file (ModelImporter::parseFromFile
    only logs 'Failed to parse ONNX model from file'): the refusal then ended in 'could not parse PATH: ' with nothing
    after it. Past five errors, the rest were dropped without a word."""

    class Parser:
        num_errors = len(errors)

        def __init__(self, network, logger):
            pass

        def parse_from_file(self, path):
            return False

        def get_error(self, index):
            return errors[index]

    monkeypatch.setattr(tensorrt, "OnnxParser", Parser)
    with pytest.raises(RuntimeBackendError) as info:
        te.build_engine(standard_bundle.path, out=tmp_path / "engine")
    model = standard_bundle.file(standard_bundle.manifest["graph"]["file"])
    assert said.format(model=model) in info.value.problem
    assert not info.value.problem.endswith(": ")
    if len(errors) > 5:
        assert info.value.problem.endswith("In node 4 (importSlice): UNSUPPORTED_NODE (and 2 more)")
    assert tensorrt.builds == 0
