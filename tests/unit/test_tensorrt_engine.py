"""TensorRT engine builder and GPU backend selection, as far as a machine without TensorRT can check.

What runs here: the cache key and the engine directory layout (deploy root and user cache),
finding a cached engine by key or by its engine.json, the optimisation profile derived from a
real Jetson bundle's manifest, the typing/flag plan per TensorRT version, ``edgesdk engine
build`` failing clearly without TensorRT, and the backend chain of a Jetson profile falling back
to ort-cpu with a reason for every GPU backend. Building and running engines: tests/gpu/test_tensorrt.py.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from edgesdk.cli import main
from edgesdk.errors import RuntimeBackendError
from edgesdk.runtime import tensorrt_engine as te
from edgesdk.runtime.session import NOT_BUILT, open_backend, open_runtime, ort_trt_options

HAS_TENSORRT = importlib.util.find_spec("tensorrt") is not None


@pytest.fixture(scope="module")
def jetson_bundle(tiny_model_dir, tmp_path_factory):
    """A real bundle for orin-nano-8gb (profile: 2:4 sparsity, fp16, chain tensorrt -> ... -> ort-cpu)."""
    from edgesdk.build.pipeline import BuildConfig, build
    from edgesdk.export.onnx_export import ExportConfig

    out = tmp_path_factory.mktemp("jetson") / "tiny-orin"
    return build(BuildConfig(target="orin-nano-8gb", model=str(tiny_model_dir), out=out, recipe="fp32-standard",
                             export=ExportConfig(max_context=64), progress=False))


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("EDGESDK_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv(te.ENGINE_DIR_ENV, raising=False)
    return tmp_path / "cache"


@pytest.fixture
def deployed(jetson_bundle, tmp_path):
    """The bundle laid out as deploy does: <root>/releases/<id>, <root>/current -> releases/<id>."""
    root = tmp_path / "deploy"
    release = root / "releases" / jetson_bundle.bundle_id
    shutil.copytree(jetson_bundle.path, release)
    os.symlink(os.path.join("releases", jetson_bundle.bundle_id), root / "current")
    return root


def fake_engine_dir(directory: Path, **info) -> Path:
    """An engine directory as the builder leaves it (placeholder plan: only the lookup is tested)."""
    directory.mkdir(parents=True)
    (directory / te.ENGINE_FILE).write_bytes(b"plan")
    (directory / te.INFO_FILE).write_text(json.dumps(info))
    return directory


# --- cache key and layout ----------------------------------------------------------------------


def test_cache_key_is_shared_with_deploy():
    from edgesdk.deploy import engine as deploy_engine

    assert te.cache_key("6.2", "10.3.0.30", 87) == "jp6.2-trt10.3.0.30-sm87"
    assert te.cache_key(None, "10.3.0", None) == "jpunknown-trt10.3.0-smunknown"
    assert deploy_engine.cache_key is te.cache_key


def test_engine_dirs_of_a_deployed_release_and_of_a_plain_bundle(jetson_bundle, deployed, cache):
    bundle_id = jetson_bundle.bundle_id
    key = te.cache_key("6.2", "10.3.0", 87)
    for path in (deployed / "releases" / bundle_id, deployed / "current"):
        assert te.engine_bases(path, bundle_id) == [(deployed / "engines" / bundle_id).resolve(),
                                                    cache / "engines" / bundle_id]
        assert te.default_out(path, bundle_id, key) == (deployed / "engines" / bundle_id / key).resolve()
    assert te.engine_bases(jetson_bundle.path, bundle_id) == [cache / "engines" / bundle_id]
    assert te.default_out(jetson_bundle.path, bundle_id, key) == cache / "engines" / bundle_id / key


def test_find_engine_by_key_then_by_engine_json(jetson_bundle, deployed, cache):
    bundle_id = jetson_bundle.bundle_id
    release = deployed / "current"
    engines = (deployed / "engines" / bundle_id).resolve()
    facts = {"bundle_id": bundle_id, "tensorrt": "10.3.0", "sm": 87}
    with pytest.raises(RuntimeBackendError, match=f"no TensorRT engine for bundle {bundle_id}") as missing:
        te.find_engine(release, bundle_id, "10.3.0", 87, "6.2")
    assert "edgesdk engine build" in missing.value.fix
    # The exact key, as deploy names it.
    exact = fake_engine_dir(engines / te.cache_key("6.2", "10.3.0", 87), **facts)
    assert te.find_engine(release, bundle_id, "10.3.0", 87, "6.2")[0] == exact
    # No JetPack facts here (a container): found by its engine.json.
    assert te.find_engine(release, bundle_id, "10.3.0", 87, None) == (exact, facts)
    # Another TensorRT or SM does not fit, and says why.
    fake_engine_dir(engines / te.cache_key("6.2", "10.7.0", 87), **facts)  # mislabelled: engine.json decides
    with pytest.raises(RuntimeBackendError, match="built by TensorRT 10.3.0, this is TensorRT 10.7.0"):
        te.find_engine(release, bundle_id, "10.7.0", 87, "6.2")
    with pytest.raises(RuntimeBackendError, match="no TensorRT engine"):
        te.find_engine(release, bundle_id, "10.3.0", 72, "6.2")


def test_a_damaged_plan_is_refused_by_its_recorded_size_and_sha256(jetson_bundle, cache, tmp_path, monkeypatch):
    import hashlib

    bundle_id = jetson_bundle.bundle_id
    facts = {"bundle_id": bundle_id, "tensorrt": "10.3.0", "sm": 87}
    sound = fake_engine_dir(tmp_path / "sound", **facts, engine_bytes=4,
                            engine_sha256=hashlib.sha256(b"plan").hexdigest())
    monkeypatch.setenv(te.ENGINE_DIR_ENV, str(sound))
    assert te.find_engine(jetson_bundle.path, bundle_id, "10.3.0", 87, "6.2")[0] == sound
    cut = fake_engine_dir(tmp_path / "cut", **facts, engine_bytes=4000)
    monkeypatch.setenv(te.ENGINE_DIR_ENV, str(cut))
    with pytest.raises(RuntimeBackendError, match=r"engine.plan is damaged \(4 bytes, engine.json says 4,000\)"):
        te.find_engine(jetson_bundle.path, bundle_id, "10.3.0", 87, "6.2")
    flipped = fake_engine_dir(tmp_path / "flipped", **facts, engine_bytes=4,
                              engine_sha256=hashlib.sha256(b"plam").hexdigest())
    monkeypatch.setenv(te.ENGINE_DIR_ENV, str(flipped))
    with pytest.raises(RuntimeBackendError, match="sha256 differs from engine.json") as info:
        te.find_engine(jetson_bundle.path, bundle_id, "10.3.0", 87, "6.2")
    assert "--force" in info.value.fix


def test_an_engine_json_that_is_no_object_or_holds_text_sizes_is_a_reason_not_a_crash(jetson_bundle, cache, tmp_path,
                                                                                     monkeypatch):
    bundle_id = jetson_bundle.bundle_id
    listed = tmp_path / "listed"
    listed.mkdir()
    (listed / te.ENGINE_FILE).write_bytes(b"plan")
    (listed / te.INFO_FILE).write_text("[1, 2]")
    monkeypatch.setenv(te.ENGINE_DIR_ENV, str(listed))
    with pytest.raises(RuntimeBackendError, match="it has no readable engine.json"):
        te.find_engine(jetson_bundle.path, bundle_id, "10.3.0", 87, "6.2")
    texty = fake_engine_dir(tmp_path / "texty", bundle_id=bundle_id, tensorrt="10.3.0", sm=87, engine_bytes="4000")
    monkeypatch.setenv(te.ENGINE_DIR_ENV, str(texty))
    with pytest.raises(RuntimeBackendError, match=r"engine.plan is damaged \(4 bytes, engine.json says '4000'\)"):
        te.find_engine(jetson_bundle.path, bundle_id, "10.3.0", 87, "6.2")


def test_engine_dir_from_the_environment(jetson_bundle, cache, tmp_path, monkeypatch):
    bundle_id = jetson_bundle.bundle_id
    explicit = fake_engine_dir(tmp_path / "mine", bundle_id=bundle_id, tensorrt="10.3.0", sm=87)
    monkeypatch.setenv(te.ENGINE_DIR_ENV, str(explicit))
    assert te.find_engine(jetson_bundle.path, bundle_id, "10.3.0", 87, "6.2")[0] == explicit
    with pytest.raises(RuntimeBackendError, match="built for sm_87, this GPU is sm_72"):
        te.find_engine(jetson_bundle.path, bundle_id, "10.3.0", 72, "6.2")
    monkeypatch.setenv(te.ENGINE_DIR_ENV, str(tmp_path / "empty"))
    with pytest.raises(RuntimeBackendError, match="holds no engine.plan"):
        te.find_engine(jetson_bundle.path, bundle_id, "10.3.0", 87, "6.2")


# --- what the builder asks TensorRT for --------------------------------------------------------


def test_profile_shapes_from_the_bundle_manifest(jetson_bundle):
    graph = jetson_bundle.manifest["graph"]
    shapes = te.profile_shapes(graph)
    ctx, hd = graph["max_context"], graph["head_dim"]
    assert (shapes.max_context, shapes.max_seq) == (ctx, ctx)  # 64 < the default prefill chunk of 512
    assert shapes.shapes[graph["inputs"]["ids"]] == ((1, 1), (1, 1), (1, ctx))
    past = [graph["inputs"]["past"].format(i=i, kind=kind) for i in range(graph["num_layers"])
            for kind in ("key", "value")]
    assert set(shapes.shapes) == {graph["inputs"]["ids"], *past}
    for i, kv in enumerate(graph["kv_heads"]):
        assert shapes.shapes[f"past_key_values.{i}.value"] == ((1, kv, 0, hd), (1, kv, ctx // 2, hd),
                                                               (1, kv, ctx - 1, hd))
    assert shapes.values == {graph["inputs"]["keep"]: ((1,), (1,), (ctx,))}
    chunked = te.profile_shapes(graph, max_seq=16)
    assert chunked.shapes["input_ids"][2] == (1, 16)
    assert chunked.values["num_logits_to_keep"][2] == (16,)
    assert json.loads(json.dumps(chunked.to_json()))["shapes"]["input_ids"] == {"min": [1, 1], "opt": [1, 1],
                                                                                "max": [1, 16]}


def test_build_plan_per_tensorrt_version(jetson_bundle):
    graph, target = jetson_bundle.manifest["graph"], jetson_bundle.manifest["target"]
    fp32 = te.plan_build("10.3.0", graph, target)
    assert (fp32.strongly_typed, fp32.flags) == (False, ("FP16", "SPARSE_WEIGHTS"))
    qdq = te.plan_build("10.3.0", {**graph, "dtype": te.QDQ_DTYPE}, target)
    assert qdq.flags == ("INT8", "FP16", "SPARSE_WEIGHTS")
    assert any(reason.startswith("INT8: the graph is explicitly quantized") for reason in qdq.reasons)
    assert te.plan_build("10.3.0", graph, target, strongly_typed=True).flags == ("SPARSE_WEIGHTS",)
    v11 = te.plan_build("11.0.0", {**graph, "dtype": te.QDQ_DTYPE}, target)
    assert (v11.strongly_typed, v11.flags) == (True, ("SPARSE_WEIGHTS",))  # no precision flags in 11
    # TensorRT 8.x has no strongly typed networks: asked for, it is refused; a float16 graph gets FP16.
    with pytest.raises(RuntimeBackendError, match="--strongly-typed needs TensorRT >= 9"):
        te.plan_build("8.6.2", graph, target, strongly_typed=True)
    half = te.plan_build("8.6.2", {**graph, "dtype": "float16"}, target)
    assert (half.strongly_typed, half.flags) == (False, ("FP16", "SPARSE_WEIGHTS"))
    with pytest.raises(RuntimeBackendError, match="bfloat16"):
        te.plan_build("8.5.2", {**graph, "dtype": "bfloat16"}, target)
    host = {**target, "name": "host", "precisions": ["fp32"], "sparsity": []}
    assert te.plan_build("10.3.0", graph, host).flags == ()
    with pytest.raises(RuntimeBackendError, match="needs the standard graph form"):
        te.check_graph_form({**graph, "form": "ort-fused"})


def test_a_cached_engine_built_with_other_options_is_not_reused(jetson_bundle):
    """'engine build --max-seq 16' (or --strongly-typed) after a default build used to return the
    cached default engine as if it were what was asked for."""
    graph, target = jetson_bundle.manifest["graph"], jetson_bundle.manifest["target"]
    default, shapes = te.plan_build("10.3.0", graph, target), te.profile_shapes(graph)
    info = {"strongly_typed": default.strongly_typed, "flags": list(default.flags), "profile": shapes.to_json()}
    assert te._built_otherwise(json.loads(json.dumps(info)), default, shapes) is None
    assert te._built_otherwise(info, default, te.profile_shapes(graph, max_seq=16)) == \
        f"it was built with max seq {graph['max_context']} (asked: 16)"
    strong = te.plan_build("10.3.0", graph, target, strongly_typed=True)
    assert te._built_otherwise(info, strong, shapes) == ("it was built with strongly typed False (asked: True), "
                                                         "flags ['FP16', 'SPARSE_WEIGHTS'] (asked: ['SPARSE_WEIGHTS'])")

def test_ort_trt_options(jetson_bundle, cache):
    options = ort_trt_options(jetson_bundle)
    assert options["trt_fp16_enable"] is True
    assert options["trt_int8_enable"] is False
    assert options["trt_engine_cache_enable"] is True
    assert options["trt_engine_cache_path"] == str(cache / "engines" / jetson_bundle.bundle_id / "ort-trt")


# --- the command without TensorRT --------------------------------------------------------------


def test_engine_build_help_is_what_deploy_probes():
    result = CliRunner().invoke(main, ["engine", "build", "--help"], prog_name="edgesdk")
    assert result.exit_code == 0, result.output
    for option in ("--out", "--workspace-mb", "--force"):
        assert option in result.stdout


@pytest.mark.skipif(HAS_TENSORRT, reason="tensorrt is importable here")
def test_engine_build_without_tensorrt_says_what_is_missing(jetson_bundle, cache, tmp_path):
    import sys

    out = tmp_path / "engine"
    result = CliRunner().invoke(main, ["engine", "build", str(jetson_bundle.path), "--out", str(out)],
                                prog_name="edgesdk")
    assert result.exit_code == RuntimeBackendError.exit_code, result.output
    assert isinstance(result.exception, SystemExit)
    assert "Traceback" not in result.output
    python = f"Python {sys.version_info.major}.{sys.version_info.minor}"
    for fragment in ("'tensorrt' cannot be imported", python, "fix:", "python3-libnvinfer",
                     "'edgesdk deploy' builds it there"):
        assert fragment in result.stderr, result.stderr
    assert not out.exists()


@pytest.mark.skipif(HAS_TENSORRT, reason="tensorrt is importable here")
def test_engine_build_names_a_fused_bundle_before_a_missing_tensorrt(tiny_bundle, cache, tmp_path):
    """TensorRT was imported first, so on a machine without it a bundle it could never build (fused
    graph) was reported only as "no TensorRT"; installing it would then have met the real refusal."""
    result = CliRunner().invoke(main, ["engine", "build", str(tiny_bundle.path), "--out", str(tmp_path / "engine")],
                                prog_name="edgesdk")
    assert result.exit_code == RuntimeBackendError.exit_code, result.output
    assert "TensorRT needs the standard graph form" in result.stderr
    assert "--recipe int8-qdq" in result.stderr


def test_a_directory_named_tensorrt_is_not_taken_for_tensorrt(tmp_path, monkeypatch):
    """A 'tensorrt' folder on sys.path (python -m puts the working directory there) imports as an
    empty namespace package; reading its version used to end in an AttributeError traceback."""
    import sys

    (tmp_path / "tensorrt").mkdir()
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        with pytest.raises(RuntimeBackendError, match="is not TensorRT's Python module") as info:
            te.import_tensorrt()
    finally:
        sys.modules.pop("tensorrt", None)  # the later tests import no namespace package
    assert str(tmp_path / "tensorrt") in info.value.problem
    assert info.value.fix.startswith("rename or move that directory")

# --- backend selection -------------------------------------------------------------------------


def test_gpu_chain_falls_back_to_ort_cpu_with_a_reason_each(jetson_bundle, cache):
    from edgesdk.runtime.session import _available_providers

    if "CUDAExecutionProvider" in _available_providers():
        pytest.skip("this onnxruntime has CUDA: ort-cuda would be used")
    backend, notes = open_backend(jetson_bundle, ["tensorrt", "ort-cuda", "triton", "ort-cpu"], threads=1)
    assert backend.name == "ort-cpu"
    assert [note.split(":")[0] for note in notes] == ["tensorrt", "ort-cuda", "triton", "ort-cpu"]
    if not HAS_TENSORRT:
        assert notes[0].startswith("tensorrt: TensorRT's Python module 'tensorrt' cannot be imported")
    assert notes[1] == "ort-cuda: onnxruntime here lacks CUDAExecutionProvider"
    if importlib.util.find_spec("edgesdk.runtime.triton_backend") is None:
        assert notes[2] == f"triton: {NOT_BUILT}"
    assert notes[2] != "triton: used"
    assert len(notes[2]) > len("triton: ")
    assert notes[3] == "ort-cpu: used"


def test_profile_chain_of_a_jetson_bundle_on_this_host(jetson_bundle, cache):
    from edgesdk.runtime.session import _available_providers

    if "CUDAExecutionProvider" in _available_providers():
        pytest.skip("this onnxruntime has CUDA")
    runtime = open_runtime(jetson_bundle.path, threads=1)
    tried = [note.split(":")[0] for note in runtime.notes if ":" in note]
    assert tried[-5:] == ["tensorrt", "ort-trt", "ort-cuda", "triton", "ort-cpu"]  # backend + fallbacks
    assert runtime.notes[-1] == "ort-cpu: used"
    assert runtime.backend.name == "ort-cpu"
    assert not (cache / "engines").exists()  # nothing written for backends that did not load


def test_unknown_backend_keeps_its_note(jetson_bundle):
    with pytest.raises(RuntimeBackendError, match=f"warp-drive: {NOT_BUILT}"):
        open_backend(jetson_bundle, ["warp-drive"], threads=1)


def test_a_misspelt_backend_option_lists_the_real_ones(jetson_bundle):
    with pytest.raises(RuntimeBackendError, match="'ort_cpu' is not a backend") as info:
        open_runtime(jetson_bundle.path, backend="ort_cpu", threads=1)
    assert "ort-cpu, ort-cuda, ort-trt, tensorrt, triton" in info.value.fix


def test_a_gpu_backend_that_cannot_load_says_what_to_install(jetson_bundle):
    from edgesdk.runtime.session import _available_providers

    if "CUDAExecutionProvider" in _available_providers():
        pytest.skip("this onnxruntime has CUDA: ort-cuda would load")
    with pytest.raises(RuntimeBackendError, match="ort-cuda: onnxruntime here lacks") as info:
        open_runtime(jetson_bundle.path, backend="ort-cuda", threads=1)
    assert info.value.fix.startswith("ort-cuda: onnxruntime-gpu")
    assert "--backend ort-cpu" in info.value.fix


def test_an_engine_that_does_not_fit_leaves_no_partial_directory(tmp_path, monkeypatch):
    """A full disk (here: a write that fails) keeps no half engine, and a killed build's leftovers go."""
    from edgesdk.runtime import tensorrt_engine as te

    out = tmp_path / "engines" / "id" / "key"
    out.parent.mkdir(parents=True)
    killed = out.with_name(f".{out.name}.partial-999999999")  # no such process
    killed.mkdir()
    (killed / te.ENGINE_FILE).write_bytes(b"half")
    swapped = out.with_name(f".{out.name}.old-999999999")  # killed between moving the old engine aside and removing it
    swapped.mkdir()
    (swapped / te.ENGINE_FILE).write_bytes(b"old")
    real_write = Path.write_bytes

    def full_disk(self, data):
        if self.name == te.ENGINE_FILE:
            raise OSError(28, "No space left on device")
        return real_write(self, data)

    monkeypatch.setattr(Path, "write_bytes", full_disk)
    with pytest.raises(RuntimeBackendError, match="No space left on device") as info:
        te._commit(out, b"\0" * 1000, {})
    assert "free space" in info.value.fix
    assert sorted(p.name for p in out.parent.iterdir()) == []
    monkeypatch.undo()
    te._commit(out, b"plan", {"ok": True})
    assert (out / te.ENGINE_FILE).read_bytes() == b"plan"
    assert sorted(p.name for p in out.parent.iterdir()) == ["key"]


def test_a_timing_cache_tensorrt_cannot_read_starts_a_new_one(tmp_path):
    """A release that answers a damaged cache file with None (instead of a cache set_timing_cache
    refuses) used to give a TypeError; both start a new cache and say so. The builder config is a
    stand-in: TensorRT is not installed here (tests/gpu/test_tensorrt.py builds real engines)."""

    class BuilderConfig:
        def __init__(self, readable: bool):
            self.readable, self.installed = readable, []

        def create_timing_cache(self, data: bytes):
            return ("cache", data) if self.readable or not data else None

        def set_timing_cache(self, cache, ignore_mismatch: bool) -> bool:
            if cache is None:
                raise TypeError("set_timing_cache(): incompatible function arguments")
            self.installed.append(cache)
            return True

    damaged = tmp_path / "timing.cache"
    damaged.write_bytes(b"\x00garbage")
    logged = []
    config = BuilderConfig(readable=False)
    te._load_timing_cache(config, damaged, logged.append)
    assert config.installed == [("cache", b"")]
    assert "does not fit this TensorRT/GPU; starting a new one" in logged[0]


def test_an_engine_is_on_the_disk_before_its_directory_is_named_complete(tmp_path, monkeypatch):
    """Without a flush before the rename, a power cut on the board could leave the key directory
    with empty files: deploy's probe then takes it for a cached engine and never builds again."""
    out = tmp_path.resolve() / "engines" / "id" / "key"  # as /proc names the flushed files
    events = []
    real_fsync, real_replace = os.fsync, os.replace
    monkeypatch.setattr(os, "fsync", lambda fd: (events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}"))),
                                                 real_fsync(fd))[1])
    monkeypatch.setattr(os, "replace", lambda src, dst: (events.append(("replace", str(dst))),
                                                         real_replace(src, dst))[1])
    te._commit(out, b"plan", {"ok": True})
    staging = str(out.with_name(f".{out.name}.partial-{os.getpid()}"))
    assert events == [("fsync", f"{staging}/{te.ENGINE_FILE}"), ("fsync", f"{staging}/{te.INFO_FILE}"),
                      ("fsync", staging), ("replace", str(out)), ("fsync", str(out.parent))]

def test_an_out_directory_holding_other_files_is_refused_not_replaced(tmp_path):
    """--out naming a directory of the user's own files (say --out ~/models) used to be moved aside
    and removed with everything in it once the engine was written."""
    mine = tmp_path / "models"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    with pytest.raises(RuntimeBackendError, match=r"holds files that are not an engine's \(notes.txt\)") as info:
        te._commit(mine, b"plan", {"ok": True})
    assert f"--out {mine / 'engine'}" in info.value.fix
    assert (mine / "notes.txt").read_text() == "keep me"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["models"]
    engine = fake_engine_dir(tmp_path / "engine")  # an engine directory is replaced as before
    te._commit(engine, b"new plan", {"ok": True})
    assert (engine / te.ENGINE_FILE).read_bytes() == b"new plan"


def test_a_timing_cache_that_cannot_be_saved_keeps_the_engine(tmp_path):
    """The timing cache only speeds up the next build: a full disk or an unwritable --timing-cache
    used to end the build in a traceback, losing the engine just built."""

    class TimingCache:
        def serialize(self) -> bytes:
            return b"timings"

    class BuilderConfig:
        def get_timing_cache(self):
            return TimingCache()

    blocked = tmp_path / "file"
    blocked.write_text("a file, not a directory")
    logged = []
    te._save_timing_cache(BuilderConfig(), blocked / "timing.cache", logged.append)
    assert logged[0].startswith(f"could not save the timing cache {blocked / 'timing.cache'}: ")
    assert "the next build times its tactics again" in logged[0]
    te._save_timing_cache(BuilderConfig(), tmp_path / "tensorrt" / "timing.cache", logged.append)
    assert (tmp_path / "tensorrt" / "timing.cache").read_bytes() == b"timings"
    assert sorted(p.name for p in (tmp_path / "tensorrt").iterdir()) == ["timing.cache"]


def test_a_directory_that_cannot_be_flushed_after_the_rename_keeps_the_engine(tmp_path, monkeypatch):
    """The engine is whole and in place once renamed; a failing flush of its parent's entries is no reason to fail."""
    out = tmp_path / "engines" / "key"
    flush = te._fsync

    def no_directory_flush(path):
        if Path(path) == out.parent:
            raise OSError(5, "Input/output error")
        flush(path)

    monkeypatch.setattr(te, "_fsync", no_directory_flush)
    te._commit(out, b"plan", {"bundle_id": "x"})
    assert (out / te.ENGINE_FILE).read_bytes() == b"plan"
