"""Generate the ModelServer CustomResourceDefinition from the pydantic models in `spec.py`.

    python -m pagoda.operator.crdgen --write   # rewrite crds/ and the chart's copy
    python -m pagoda.operator.crdgen           # print it

Pydantic emits JSON Schema (draft 2020-12); a CRD wants a structural OpenAPI v3.0 schema. The walk
below inlines `$ref`s, folds `Optional` (anyOf with null) into the plain type, turns numeric
`exclusiveMinimum` into the v3.0 boolean form, and gives sub-objects their whole defaulted value
as `default`, which the API server validates (CEL included) as it stands.
"""

from __future__ import annotations

import argparse
import sys
import typing
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel

from pagoda.operator import spec as s

ROOT = Path(__file__).resolve().parents[1]
CRD_PATH = ROOT / "crds" / "modelservers.yaml"
CHART_CRD_PATH = ROOT / "charts" / "pagoda" / "templates" / "crd.yaml"

_DROP = {"title", "additionalProperties"}

PRINTER_COLUMNS = [
    {"name": "Model", "type": "string", "jsonPath": ".spec.model.uri"},
    {"name": "Ready", "type": "integer", "jsonPath": ".status.readyReplicas"},
    {"name": "Desired", "type": "integer", "jsonPath": ".spec.replicas"},
    {"name": "Waiting", "type": "number", "jsonPath": ".status.waitingRequests"},
    {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
]


def _factory_defaults(model: type[BaseModel]) -> dict[str, Any]:
    """Pydantic leaves default_factory out of JSON Schema; the CRD needs it to default nested fields."""
    out = {}
    for name, field in model.model_fields.items():
        if field.default_factory is None:
            continue
        value = field.default_factory()
        # The whole defaulted object, not {}: the API server checks a default against the schema's
        # CEL rules as it stands (nested defaults are not applied to it), and `{}` has no fields.
        out[field.alias or name] = (
            value.model_dump(by_alias=True, exclude_none=True, mode="json") if isinstance(value, BaseModel) else value
        )
    return out


def _models(root: type[BaseModel]) -> dict[str, type[BaseModel]]:
    """Every BaseModel reachable from root, by class name (how pydantic names its $defs)."""
    found: dict[str, type[BaseModel]] = {}
    stack = [root]
    while stack:
        model = stack.pop()
        if model.__name__ in found:
            continue
        found[model.__name__] = model
        for field in model.model_fields.values():
            for arg in _walk_types(field.annotation):
                if isinstance(arg, type) and issubclass(arg, BaseModel):
                    stack.append(arg)
    return found


def _walk_types(tp: Any):
    yield tp
    for arg in typing.get_args(tp):
        yield from _walk_types(arg)


def _convert(node: Any, defs: dict, models: dict[str, type[BaseModel]], model_name: str | None = None) -> Any:
    if isinstance(node, list):
        return [_convert(n, defs, models) for n in node]
    if not isinstance(node, dict):
        return node
    if "x-pagoda-raw" in node:
        out = dict(node["x-pagoda-raw"])
        if "description" in node:
            out["description"] = node["description"]
        return out
    if "$ref" in node:
        name = node["$ref"].rsplit("/", 1)[-1]
        merged = {**defs[name], **{k: v for k, v in node.items() if k != "$ref"}}
        return _convert(merged, defs, models, name)
    if "anyOf" in node:
        options = [o for o in node["anyOf"] if o.get("type") != "null"]
        if len(options) != 1:
            raise ValueError(f"cannot express anyOf {node['anyOf']} structurally")
        rest = {k: v for k, v in node.items() if k != "anyOf" and not (k == "default" and v is None)}
        return _convert({**options[0], **rest}, defs, models)

    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in _DROP or (key == "default" and value is None):
            continue
        if key == "properties":
            out[key] = {k: _convert(v, defs, models) for k, v in value.items()}
        elif key in ("items",):
            out[key] = _convert(value, defs, models)
        elif key == "exclusiveMinimum":
            out["minimum"], out["exclusiveMinimum"] = value, True
        elif key == "exclusiveMaximum":
            out["maximum"], out["exclusiveMaximum"] = value, True
        elif key == "const":
            out["enum"] = [value]
        else:
            out[key] = value
    if node.get("type") == "object" and isinstance(node.get("additionalProperties"), dict):
        out["additionalProperties"] = _convert(node["additionalProperties"], defs, models)
    if model_name in models:
        model = models[model_name]
        for alias, default in _factory_defaults(model).items():
            out["properties"][alias].setdefault("default", default)
        if model.model_config.get("extra") == "allow":
            out["x-kubernetes-preserve-unknown-fields"] = True
    if node.get("type") == "object" and "properties" not in out and "additionalProperties" not in out:
        out.setdefault("x-kubernetes-preserve-unknown-fields", True)
    return out


def openapi_schema(model: type[BaseModel]) -> dict:
    raw = model.model_json_schema(by_alias=True, mode="validation", ref_template="#/$defs/{model}")
    defs = raw.pop("$defs", {})
    return _convert(raw, defs, _models(model), model.__name__)


def build_crd() -> dict:
    schema = {
        "type": "object",
        "description": "A model served by Pagoda: GPU Deployment, Service and warm model cache.",
        "required": ["spec"],
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"type": "object"},
            "spec": openapi_schema(s.ModelServerSpec),
            "status": openapi_schema(s.ModelServerStatus),
        },
        "x-kubernetes-validations": s.ROOT_RULES,
    }
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": f"{s.PLURAL}.{s.GROUP}",
            "labels": {"app.kubernetes.io/name": "pagoda", "app.kubernetes.io/part-of": "pagoda"},
        },
        "spec": {
            "group": s.GROUP,
            "names": {
                "kind": s.KIND,
                "listKind": f"{s.KIND}List",
                "plural": s.PLURAL,
                "singular": s.KIND.lower(),
                "shortNames": ["ms"],
                "categories": ["pagoda"],
            },
            "scope": "Namespaced",
            "versions": [
                {
                    "name": s.VERSION,
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": schema},
                    "subresources": {
                        "status": {},
                        "scale": {
                            "specReplicasPath": ".spec.replicas",
                            "statusReplicasPath": ".status.replicas",
                            "labelSelectorPath": ".status.selector",
                        },
                    },
                    "additionalPrinterColumns": PRINTER_COLUMNS,
                }
            ],
        },
    }


class _NoAliases(yaml.SafeDumper):
    """Shared sub-schemas are written out in full: anchors read badly in a CRD."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def _dump(obj: dict) -> str:
    return yaml.dump(obj, Dumper=_NoAliases, sort_keys=False, width=100)


HEADER = "# Generated by `python -m pagoda.operator.crdgen --write` from operator/spec.py. Do not edit.\n"


def render_crd_yaml() -> str:
    return HEADER + _dump(build_crd())


def render_chart_crd() -> str:
    """The chart's copy: a template, so `helm upgrade` updates the CRD (kept on uninstall)."""
    crd = build_crd()
    crd["metadata"]["annotations"] = {"helm.sh/resource-policy": "keep"}
    body = _dump(crd)
    return (
        HEADER.replace("# ", "{{/* ", 1).rstrip("\n")
        + " */}}\n{{- if .Values.crds.install }}\n"
        + body
        + "{{- end }}\n"
    )


def outputs() -> dict[Path, str]:
    return {CRD_PATH: render_crd_yaml(), CHART_CRD_PATH: render_chart_crd()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m pagoda.operator.crdgen", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--write", action="store_true", help="write crds/ and the chart's CRD template")
    args = parser.parse_args(argv)
    if not args.write:
        sys.stdout.write(render_crd_yaml())
        return 0
    for path, text in outputs().items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        print(f"wrote {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
