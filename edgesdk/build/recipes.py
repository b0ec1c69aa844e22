"""Recipes: named, validated lists of stages and their configs (YAML in edgesdk/recipes/)."""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from edgesdk.build.registry import check_order, make_config
from edgesdk.errors import BuildError


class StageEntry(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    stage: str
    config: dict = Field(default_factory=dict)


class ExportSection(BaseModel):
    """The graph the recipe exports (see export/onnx_export.py ExportConfig)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    form: Literal["standard", "ort-fused"] = "standard"
    weights: Literal["fp32", "int8", "int4"] = "fp32"
    block_size: int = 32


class Recipe(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    name: str
    description: str = ""
    stages: tuple[StageEntry, ...] = ()
    export: ExportSection = Field(default_factory=ExportSection)

    def validated(self) -> list[tuple[str, object]]:
        """(stage name, config object) pairs, order and configs checked."""
        names = [entry.stage for entry in self.stages]
        check_order(names)
        return [(entry.stage, make_config(entry.stage, entry.config)) for entry in self.stages]


def shipped_recipes() -> list[str]:
    return sorted(p.name[:-5] for p in resources.files("edgesdk.recipes").iterdir() if p.name.endswith(".yaml"))


def load_recipe(name_or_path: str) -> Recipe:
    if name_or_path.endswith((".yaml", ".yml")):
        path = Path(name_or_path)
        if not path.is_file():
            raise BuildError(f"recipe file {path} does not exist", "pass a shipped recipe name or a YAML path")
        text, source = path.read_text(encoding="utf-8"), str(path)
    else:
        if name_or_path not in shipped_recipes():
            raise BuildError(f"unknown recipe '{name_or_path}'; shipped: {', '.join(shipped_recipes())}",
                             "pass one of those or the path of a recipe YAML")
        text = (resources.files("edgesdk.recipes") / f"{name_or_path}.yaml").read_text(encoding="utf-8")
        source = f"recipes/{name_or_path}.yaml"
    try:
        return Recipe.model_validate(yaml.safe_load(text))
    except (ValidationError, yaml.YAMLError) as exc:
        raise BuildError(f"recipe {source} is invalid: {exc}", "compare it with edgesdk/recipes/default.yaml") from exc
