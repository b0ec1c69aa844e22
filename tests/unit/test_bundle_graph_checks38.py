"""A bundle whose graph disagrees with its manifest or with its own weights is refused when it is opened,
by name: the manifest's max_context against the graph's rotary tables, and a fuzz of the graph's
initializer records (names, element types, shapes, external locations, offsets, lengths) and of the
manifest's 'graph.weights' record. model.onnx and the manifest are rewritten with their hashes, as a
careless user or an attacker would, so only the checks at open can catch them; every case either runs
to the same logits as the intact bundle or ends in a BundleError that names the tensor, never in
onnxruntime's own wording, a traceback at the first step, or other logits."""

from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
pytest.importorskip("torch")

from click.testing import CliRunner  # noqa: E402

from edgesdk.cli import main  # noqa: E402
from edgesdk.errors import BundleError  # noqa: E402
from edgesdk.runtime.session import open_runtime  # noqa: E402
from tests._utils.builds import build_tiny_bundle  # noqa: E402
from tests.unit.test_bundle_damage36 import ZLIB_RECIPE, copy_bundle, relist, rewrite_manifest  # noqa: E402

PROMPT = np.array([1, 5, 9, 13, 17], np.int64)
# a plain bundle's graph names a file beside it; a zlib-coded one's must name 'graph.weights.external_name'
# a rotary table of another shape than its partner is named for that first
RESHAPED = r"needs \d+ bytes|differ in shape"
ELSEWHERE = r"which the bundle lacks|is not a weights file in the bundle|but the bundle's weights"


@pytest.fixture(scope="module")
def zlib_bundle(tmp_path_factory):
    return build_tiny_bundle(tmp_path_factory.mktemp("zlib38"), ZLIB_RECIPE, "host", generated_sequences=0)


def logits(path) -> np.ndarray:
    backend = open_runtime(path, threads=1, ignore_target=True).backend
    return np.concatenate([backend.prefill(PROMPT, 1).ravel(), backend.decode(3).ravel()])


def refused(path, match: str) -> BundleError:
    with pytest.raises(BundleError, match=match) as info:
        open_runtime(path, threads=1, ignore_target=True)
    message = str(info.value)
    assert str(path) in message
    assert info.value.fix
    assert "ONNXRuntimeError" not in message
    assert "ONNX Runtime could not load" not in message
    return info.value


# --- max_context against the rotary table ---------------------------------------------------------------

def test_a_max_context_past_the_rotary_table_is_refused_at_open_with_the_numbers(tiny_bundle, tmp_path):
    """It opened, and the step reaching position 257 failed inside GroupQueryAttention ("cos_cache dimension 0
    shall not be less than total_sequence_length") after 256 tokens had been generated."""
    table = tiny_bundle.manifest["graph"]["max_context"]
    path = copy_bundle(tiny_bundle, tmp_path / "longer")
    rewrite_manifest(path, lambda manifest: manifest["graph"].update(max_context=table * 4))
    refused(path, rf"'graph.max_context' is {table * 4}, but the rotary table 'rotary.cos' holds {table} positions")
    result = CliRunner().invoke(main, ["run", str(path), "-p", "hi", "-n", "1", "--ignore-target", "--threads", "1"])
    assert result.exit_code == BundleError.exit_code, result.output
    assert f"holds {table} positions" in result.output
    assert "fix:" in result.output
    assert result.stdout == ""
    assert "Traceback" not in result.output
    shorter = copy_bundle(tiny_bundle, tmp_path / "shorter")  # a shorter context uses part of the table: fine
    rewrite_manifest(shorter, lambda manifest: manifest["graph"].update(max_context=table - 1))
    assert open_runtime(shorter, threads=1, ignore_target=True).backend.max_context == table - 1


# --- the graph's initializer records, fuzzed -----------------------------------------------------------------

def _tensor(model, name):
    return next(tensor for tensor in model.graph.initializer if tensor.name == name)


def _external(name, key, value):
    def edit(model):
        for entry in _tensor(model, name).external_data:
            if entry.key == key:
                entry.value = value(entry.value)
    return edit


def _set(name, field, value):
    return lambda model: setattr(_tensor(model, name), field, value)


def _dims(name, change):
    def edit(model):
        tensor = _tensor(model, name)
        dims = change(list(tensor.dims))
        del tensor.dims[:]
        tensor.dims.extend(dims)
    return edit


def _inline_without_data(name):
    def edit(model):
        tensor = _tensor(model, name)
        tensor.ClearField("external_data")
        tensor.data_location = onnx.TensorProto.DEFAULT
    return edit


def _edits(model) -> dict:
    """Edits of one external tensor in the middle of the weights file, of the rotary table, and of an inline one."""
    external = [t.name for t in model.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL]
    inline = next(t.name for t in model.graph.initializer if t.raw_data and len(t.dims) == 1 and t.dims[0] > 1)
    middle = external[len(external) // 2]
    edits = {}
    for name in (middle, "rotary.cos"):
        edits.update({
            # each of these was onnxruntime's own load error (External data path validation failed, Deserialize
            # tensor ... failed, parse_string.h ParseStringWithClassicLocale ...) as the only explanation
            f"{name}:location-missing": (_external(name, "location", lambda v: "missing.data"), ELSEWHERE),
            f"{name}:location-graph": (_external(name, "location", lambda v: "model.onnx"), ELSEWHERE),
            f"{name}:location-escapes": (_external(name, "location", lambda v: "../" + v), ELSEWHERE),
            f"{name}:location-absolute": (_external(name, "location", lambda v: "/etc/hostname"), ELSEWHERE),
            f"{name}:offset-past-end": (_external(name, "offset", lambda v: str(10 ** 12)), "which holds"),
            f"{name}:offset-negative": (_external(name, "offset", lambda v: "-8"), "at an offset >= 0"),
            f"{name}:offset-text": (_external(name, "offset", lambda v: "x"), "expected whole numbers"),
            f"{name}:length-longer": (_external(name, "length", lambda v: str(int(v) + 4)), r"needs \d+ bytes"),
            f"{name}:length-shorter": (_external(name, "length", lambda v: str(int(v) - 4)), r"needs \d+ bytes"),
            f"{name}:type-float16": (_set(name, "data_type", onnx.TensorProto.FLOAT16), r"needs \d+ bytes"),
            f"{name}:type-undefined": (_set(name, "data_type", 0), "element type 0, which is no ONNX tensor type"),
            f"{name}:type-unknown": (_set(name, "data_type", 99), "element type 99, which is no ONNX tensor type"),
            f"{name}:dim-larger": (_dims(name, lambda d: [d[0] + 1, *d[1:]]), RESHAPED),
            f"{name}:dim-smaller": (_dims(name, lambda d: [d[0] - 1, *d[1:]]), RESHAPED),
            f"{name}:dim-negative": (_dims(name, lambda d: [-d[0], *d[1:]]), f"a dimension is negative|{RESHAPED}"),
            f"{name}:renamed": (_set(name, "name", name + ".renamed"), rf"reads '{name}', which no graph input"),
            f"{name}:no-data": (_inline_without_data(name), "holds no data"),
        })
    # accepted before, and read a neighbour's bytes: other logits with no error
    edits[f"{middle}:offset+4"] = (_external(middle, "offset", lambda v: str(int(v) + 4)), "overlap")
    edits[f"{middle}:offset-4"] = (_external(middle, "offset", lambda v: str(int(v) - 4)), "overlap")
    # accepted before, then a RuntimeError from GroupQueryAttention in the first step (cos and sin shapes differ)
    edits["rotary.cos:transposed"] = (_dims("rotary.cos", lambda d: d[::-1]), "differ in shape")
    edits["rotary.cos:extra-axis"] = (_dims("rotary.cos", lambda d: [*d, 1]), "differ in shape")
    edits[f"{inline}:bytes-cut"] = (lambda m: setattr(_tensor(m, inline), "raw_data", _tensor(m, inline).raw_data[:-4]),
                                    rf"initializer '{inline}' holds \d+ bytes")
    edits[f"{inline}:dim-larger"] = (_dims(inline, lambda d: [d[0] + 1]), rf"initializer '{inline}' holds \d+ bytes")
    return edits


# edits that leave the tensor as it was: they must keep running, to the same logits
HARMLESS = {"no-length": lambda model: _tensor(model, "rotary.cos").external_data.pop(),  # the length follows the shape
            "inline-reversed": _dims("layers.0.input_norm", lambda d: d[::-1])}


@pytest.mark.parametrize("kind", ["plain", "zlib"])
def test_every_edit_of_the_graphs_initializer_records_runs_alike_or_is_refused_by_name(tiny_bundle, zlib_bundle,
                                                                                       tmp_path, kind):
    bundle = tiny_bundle if kind == "plain" else zlib_bundle
    intact = logits(bundle.path)
    model = onnx.load(str(bundle.path / "model.onnx"), load_external_data=False)
    cases = {**_edits(model), **{name: (edit, None) for name, edit in HARMLESS.items()}}
    for label, (edit, match) in cases.items():
        path = copy_bundle(bundle, tmp_path / label.replace(":", "-"))
        edited = onnx.load(str(path / "model.onnx"), load_external_data=False)
        edit(edited)
        onnx.save_model(edited, str(path / "model.onnx"))
        relist(path, "model.onnx")
        if match is None:
            np.testing.assert_allclose(logits(path), intact, atol=1e-5, err_msg=label)
            continue
        error = refused(path, match)
        assert "model.onnx" in error.problem, label


def test_a_weights_record_that_names_another_file_than_the_graph_reads_is_refused_by_name(zlib_bundle, tmp_path):
    """Each was onnxruntime's 'InjectExternalInitializersFromFilesInMemory External file: ... not found' (the
    graph.weights record's external_name), or its 'External data path validation failed' (the record dropped)."""
    stored = zlib_bundle.manifest["graph"]["weights"]["external_name"]
    for name in ("other.data", "model.onnx", stored + ".zlib"):
        path = copy_bundle(zlib_bundle, tmp_path / name)
        rewrite_manifest(path, lambda manifest, n=name: manifest["graph"]["weights"].update(external_name=n))
        refused(path, rf"initializers are stored in '{stored}', but the bundle's weights "
                      rf"\('graph.weights.external_name'\) are '{name}'")
    path = copy_bundle(zlib_bundle, tmp_path / "dropped")
    rewrite_manifest(path, lambda manifest: manifest["graph"].pop("weights") and None)
    refused(path, rf"initializers are stored in '{stored}', which the bundle lacks \(a bundle whose weights are "
                  r"entropy-coded names them in 'graph.weights'\)")


def test_a_graph_file_that_is_no_onnx_model_is_refused_by_name(tiny_bundle, tmp_path):
    """'graph.file' pointed at another listed file: onnxruntime's 'Protobuf parsing failed' before."""
    path = copy_bundle(tiny_bundle, tmp_path)
    rewrite_manifest(path, lambda manifest: manifest["graph"].update(file="tokenizer.json"))
    refused(path, r"tokenizer.json is not a readable ONNX model \(")
