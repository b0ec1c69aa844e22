"""Assemble a bundle from the export directory, the tokenizer and the build records."""

from __future__ import annotations

import re
import tempfile
from pathlib import Path

from tokenizers import Tokenizer

from edgesdk.build import report
from edgesdk.build.checkpoint import disk_full, disk_refused, said
from edgesdk.bundle import MANIFEST, MANIFEST_DIGEST, Bundle, BundleWriter, _relative_files, verify_bundle
from edgesdk.errors import BuildError
from edgesdk.export.onnx_export import DATA_FILE, MODEL_FILE
from edgesdk.runtime.text import SPECIAL_TOKEN_VARIABLES, end_of_generation_ids
from edgesdk.weights_file import store_weights


def eos_token_ids(model, tokenizer) -> list[int]:
    """Every id that ends generation: config, generation config and tokenizer EOS, and the tokens of the whole
    vocabulary whose text is one of edgesdk.runtime.text.END_OF_GENERATION_TEXTS (as llama.cpp's vocab loader finds
    them: a raw prompt stops at the end of a document as a chat turn at its end), less those llama.cpp takes out again
    (:func:`edgesdk.runtime.text.end_of_generation_ids`: gpt-oss's ``<|end|>``, Gemma 4's ``</s>``). The FIM pad,
    repo and file-separator tokens, which llama.cpp ends generation at as well, the runtime adds itself."""
    ids: set[int] = set()
    for value in (getattr(model.config, "eos_token_id", None),
                  getattr(getattr(model, "generation_config", None), "eos_token_id", None),
                  tokenizer.eos_token_id):
        if isinstance(value, int):
            ids.add(value)
        elif isinstance(value, (list, tuple)):
            ids.update(int(v) for v in value)
    vocab = tokenizer.get_vocab() if hasattr(tokenizer, "get_vocab") else {}
    return sorted(end_of_generation_ids(vocab.get, ids))


def template_special_tokens(tokenizer) -> dict[str, str]:
    """The text of the special tokens beside BOS, EOS and padding that transformers' ``apply_chat_template`` hands a
    chat template (its tokenizer's ``special_tokens_map``: ``unk_token``, ``sep_token``, ``cls_token``,
    ``mask_token``), each only where the tokenizer has one, for the manifest to record: the runtime renders the
    template with the manifest's tokens (edgesdk.runtime.text.ChatTokenizer), and the tokenizer.json it gets holds
    none of them where they live only in tokenizer_config.json (SmolLM2's and Qwen's ``unk_token``, Gemma's
    ``mask_token``) or in a GGUF file's ``tokenizer.ggml.unknown_token_id``, which transformers' reader turns into
    the tokenizer's ``unk_token``. The padding token is recorded apart, as ``pad_token`` (null where there is none),
    as bundles recorded it before these."""
    named = getattr(tokenizer, "special_tokens_map", None) or {}
    return {name: str(named[name]) for name in SPECIAL_TOKEN_VARIABLES
            if name != "pad_token" and named.get(name) is not None}


# the named templates a tokenizer with several is read for, in order: llama.cpp's common_chat_templates_init
# (common/chat.cpp) takes the "tool_use" template as the default where the model has no default one (a GGUF's
# tokenizer.chat_template.tool_use without tokenizer.chat_template); transformers' apply_chat_template refuses a dict
# without "default" unless given a name, and picks "tool_use" for a chat with tools
TEMPLATE_NAMES = ("default", "tool_use")


def chosen_chat_template(tokenizer) -> tuple[str | None, str | None]:
    """(template, name): the template a chat is rendered with, and the name it had where the tokenizer has several
    (a dict of named templates, as transformers makes ``chat_template`` of a tokenizer_config that lists them: ``[{"name":
    "default", ...}, {"name": "tool_use", ...}]``, or of a chat_templates/ folder). Of several, the one named
    "default", else the one named "tool_use", as llama.cpp takes them (:data:`TEMPLATE_NAMES`); (None, None) where
    the tokenizer has neither (a lone template's name is None)."""
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, dict):
        for name in TEMPLATE_NAMES:
            if isinstance(template.get(name), str) and template[name]:
                return template[name], name
        return None, None
    return (template, None) if isinstance(template, str) and template else (None, None)


def chat_template(tokenizer) -> str | None:
    """The template the bundle renders a chat with (:func:`chosen_chat_template`); None where it has none."""
    return chosen_chat_template(tokenizer)[0]


def _template_line(tokenizer) -> list[str]:
    """The report's line on which of a tokenizer's named templates the bundle keeps, or why it keeps none; nothing
    for a tokenizer with one template or none (the manifest's tokenizer.chat_template says which)."""
    templates = getattr(tokenizer, "chat_template", None)
    if not isinstance(templates, dict):
        return []
    names = ", ".join(repr(name) for name in sorted(templates, key=str))
    _, name = chosen_chat_template(tokenizer)
    if name is None:
        return [f"- chat template: none kept: the tokenizer's named templates ({names}) include neither 'default' "
                "nor 'tool_use', the ones llama.cpp reads"]
    why = "" if name == "default" else " (it has no 'default': llama.cpp takes 'tool_use' as the default then)"
    return [f"- chat template: the tokenizer's {name!r} template, of {names}{why}"]


def _code_span(text: str) -> str:
    """``text`` as a Markdown code span, so that a path's own characters (``*``, ``[``, ``|``, a backtick) show
    as they are; a line break is written as ``\\n`` (it would end the heading the span is in)."""
    text = text.replace("\r", "\\r").replace("\n", "\\n")
    fence = "`" * (max((len(run) for run in re.findall(r"`+", text)), default=0) + 1)
    pad = " " if "`" in text else ""  # a span that starts or ends with a backtick needs the space
    return f"{fence}{pad}{text}{pad}{fence}"


def _report(manifest: dict, sizes: dict[str, int], plot_name: str | None = None,
            plot_left_out: str | None = None, template_lines: list[str] = (), export=None) -> str:
    before, after = manifest["model"]["before"], manifest["model"]["after"]
    fp16_bytes = before["parameters"] * 2
    total = sum(sizes.values())
    lines = [
        f"# edgesdk bundle: {_code_span(before['source'])} for {manifest['target']['name']}",
        "",
        f"- architecture: {before['architecture']}, {before['layers']} layers, hidden {before['hidden_size']}, "
        f"heads {before['attention_heads']} (kv {before['kv_heads']}), vocab {before['vocab_size']}",
        f"- parameters: {before['parameters']:,} before, {after['parameters']:,} after"
        + (f"; {after['layers']} of {before['layers']} layers kept" if after.get("layers", before["layers"])
           != before["layers"] else ""),
        *(f"- LoRA adapter merged before the stages: {_code_span(Path(adapter['path']).name)} ({adapter['form']}, "
          f"rank {adapter['rank']}, scale {adapter['scale']:g}, sha256 {adapter['sha256'][:12]})"
          for adapter in before.get("adapters") or []),
        f"- recipe: {manifest['recipe']['name']}; stages: "
        + (", ".join(s["stage"] for s in manifest["stages"]) or f"none ({manifest['graph']['dtype']} export)"),
        f"- graph: {manifest['graph']['form']} form, {manifest['graph']['dtype']}, "
        f"max context {manifest['graph']['max_context']}",
        f"- size: {total / 1e6:.1f} MB on disk vs {fp16_bytes / 1e6:.1f} MB for the FP16 model "
        f"({total / fp16_bytes:.2f}x)",
        f"- default backend: {manifest['runtime']['backend']} (fallbacks: "
        f"{', '.join(manifest['runtime']['fallbacks']) or 'none'}), {manifest['runtime']['threads']} threads",
        *_generation_lines(manifest.get("generation")),
        *template_lines,
        "",
        "## Export check (ONNX Runtime vs PyTorch, max |diff|)",
        "",
        "| output | max abs diff |",
        "|---|---|",
    ]
    # sorted: the rows must not depend on the order a record was built or reloaded in (the bundle id hashes this file)
    lines += [f"| {name} | {diff:.3e} |" for name, diff in sorted(manifest["export_validation"]["max_abs_diff"].items())]
    lines += ["", f"Greedy top-1 agreement over the decode steps: "
              f"{_agreement(manifest['export_validation']['top1_agree'])}",
              "", "## Files", "", "| file | bytes |", "|---|---|"]
    lines += [f"| {name} | {size:,} |" for name, size in sorted(sizes.items())]
    lines += ["", f"and {REPORT} (this report), {MANIFEST}, which lists every file's size and sha256, and "
              f"{MANIFEST_DIGEST}, its digest"]
    lines += _sparse_lines(manifest.get("sparse"))
    lines += report.markdown(report.stage_rows(manifest.get("baseline"), manifest["stages"]), plot_name,
                             plot_left_out, export)
    return "\n".join(lines) + "\n"


REPORT = "report.md"


def _agreement(share: float | None) -> str:
    """A check's greedy top-1 agreement as a percentage; None is a check that ran no decode step
    (ValidationConfig decode_steps 0), whose agreement was not measured, not 0%."""
    return "not measured (no decode steps)" if share is None else f"{share:.0%}"


def _generation_lines(record: dict | None) -> list[str]:
    """The model's own sampling settings, which run, serve and load() use for every option not given."""
    if not record:
        return []
    from edgesdk.models.generation_defaults import describe, source_words

    return [f"- sampling defaults: {describe(record['sampling'])} (from {source_words(record['source'])}; used "
            "where a run or request sets none)"]


def _sparse_lines(record: dict | None) -> list[str]:
    """The block-sparse weights' part of the report: blocks kept, the bytes the ``triton`` backend reads
    per token against dense INT8 (the stage table's weight bytes are the QDQ graph's, which stores every
    block), their check against PyTorch and the kernels compiled for the board."""
    if not record:
        return []
    block, sparse, dense = record["block"], record["bytes_sparse"], record["bytes_dense_int8"]
    lines = ["", "## Block-sparse weights (`triton` backend)", "",
             f"- {block} x {block} blocks, {record.get('layout', 'plain')} layout; {record['density']:.1%} of the "
             "decoder weights' blocks kept",
             f"- decoder weights read per token: {sparse / 1e6:.1f} MB (INT8 blocks, block indices, row scales) "
             f"against {dense / 1e6:.1f} MB dense INT8 ({sparse / max(dense, 1):.3f}x)"]
    check = record.get("validation")
    if check:
        worst = ", ".join(f"{name} {diff:.3e}" for name, diff in sorted(check["max_abs_diff"].items()))
        lines.append(f"- against PyTorch: max |diff| {worst}; greedy top-1 agreement {_agreement(check['top1_agree'])}")
    kernels = record.get("kernels")
    if kernels:
        lines.append(f"- kernels compiled for sm_{kernels['sm']} in `{kernels['dir']}/`: "
                     + ", ".join(kernels["kernels"]))
    return lines


def write_bundle(out: Path, *, export_dir: Path, graph: dict, validation: dict, profile, recipe, stages: list,
                 model, tokenizer, facts_before: dict, facts_after: dict, baseline: dict | None = None,
                 sparse: dict | None = None, weights_codec: str = "none", generation: dict | None = None,
                 terms: str = "cli") -> Bundle:
    """Write the bundle at ``out`` and verify it. ``terms``: whose names the refusal of an output directory taken
    while the build ran gives it, edgesdk build's (``--out``) or build_bundle()'s (``out``): BuildConfig.terms."""
    from edgesdk.build.sparse_step import bundle_files

    writer = BundleWriter(out, terms)
    try:
        writer.add_file(export_dir / MODEL_FILE)
        data_name, weights_record = store_weights(export_dir / DATA_FILE, writer.staging, weights_codec)
        if weights_record:
            graph = {**graph, "weights": weights_record}
        extra = bundle_files(export_dir, sparse)
        for name in extra:
            writer.add_file(export_dir / name, name)
        # the temporary files on the bundle's disk, as every other file it writes: one full disk to name and free
        with tempfile.TemporaryDirectory(dir=writer.staging) as tmp:
            tokenizer.save_pretrained(tmp)
            # the same tokenizer, no indentation: 1.5 MB instead of 3.5 for SmolLM2
            compact = Tokenizer.from_file(str(Path(tmp) / "tokenizer.json"))
            compact.save(str(writer.staging / "tokenizer.json"), pretty=False)
        template, template_name = chosen_chat_template(tokenizer)
        if template:
            writer.write_text("chat_template.jinja", template)
        manifest = {
            "target": profile.summary(),
            "recipe": {"name": recipe.name, "description": recipe.description},
            "model": {"before": facts_before, "after": facts_after},
            "stages": [{k: v for k, v in s.items() if k != "seconds"} for s in stages],
            "timings": {s["stage"]: s.get("seconds") for s in stages},  # not part of the bundle id
            "baseline": baseline,
            "graph": {**graph, "file": MODEL_FILE},
            "export_validation": validation,
            "tokenizer": {
                "file": "tokenizer.json",
                "chat_template": "chat_template.jinja" if template else None,
                "bos_token": tokenizer.bos_token,
                "eos_token": tokenizer.eos_token,
                # the GGUF export writes its id as tokenizer.ggml.padding_token_id, as llama.cpp's converter does
                "pad_token": tokenizer.pad_token,
                # unk/sep/cls/mask, each where the tokenizer has one: the chat template is given them
                **template_special_tokens(tokenizer),
                "eos_token_ids": eos_token_ids(model, tokenizer),
            },
            "runtime": {
                "backend": profile.runtime.backend,
                "fallbacks": list(profile.runtime.fallbacks),
                "threads": profile.runtime.threads,
            },
            "eval": {},
        }
        if template_name is not None:  # which of the tokenizer's named templates chat_template.jinja is
            manifest["tokenizer"]["chat_template_name"] = template_name
        if sparse:
            manifest["sparse"] = sparse
        if generation:  # the model's own sampling settings (edgesdk/models/generation_defaults.py)
            manifest["generation"] = generation
        plot_name = plot_left_out = None
        rows = report.stage_rows(baseline, stages)
        if rows:
            with tempfile.TemporaryDirectory(dir=writer.staging) as tmp:
                png = Path(tmp) / "report.png"
                plot_left_out = report.plot(rows, png)
                if plot_left_out is None:
                    writer.add_file(png)
                    plot_name = png.name
        # every file staged: the graph, weights, tokenizer, chat template, plot and the files the stages added
        sizes = {name: (writer.staging / name).stat().st_size for name in _relative_files(writer.staging)}
        writer.write_text(REPORT, _report(manifest, sizes, plot_name, plot_left_out, _template_line(tokenizer),
                                            recipe.export))
        # the report states a non-finite figure as such; the manifest, JSON, holds null for it
        writer.commit(report.finite_json(manifest))
    except BaseException as exc:  # a full disk, Ctrl-C, an output directory taken meanwhile: no hidden copy is left
        writer.discard()
        if isinstance(exc, Exception) and disk_full(exc):
            raise _bundle_disk_full(exc, out, terms) from exc
        raise
    return verify_bundle(out)


def _bundle_disk_full(exc: Exception, out: Path, terms: str) -> BuildError:
    """The error for a bundle the disk had no room for (:func:`edgesdk.build.checkpoint.disk_full`): the bundle, the
    file being written where the error names it, and the space left once the staged copy is removed, not a bare
    ``[Errno 28] No space left on device`` (or the tokenizers library's ``(os error 28)``) naming no bundle. The
    build's finished steps, the export included, stay in its work directory for a resumed build."""
    return disk_refused(exc, f"the bundle {out}", out.parent,
                         f", then run the build again with {said('--resume', terms)}: the export is kept in the "
                         "build's work directory, and is not made again")
