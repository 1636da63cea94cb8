"""What the API server does with a ModelServer before storing it, for tests: apply the CRD's
defaults, validate the structural schema (OpenAPI v3.0 ~ JSON Schema draft 4) and evaluate the CEL
rules (`x-kubernetes-validations`, with oldSelf on updates) with cel-python."""

from __future__ import annotations

import copy
import functools
from typing import Any

import celpy
import jsonschema

from pagoda.operator.crdgen import build_crd


@functools.cache
def crd_schema() -> dict:
    return build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def apply_defaults(schema: dict, value: Any) -> Any:
    """Structural defaulting: a missing property with a default gets it, then nested defaults apply."""
    if isinstance(value, dict) and "properties" in schema:
        for key, sub in schema["properties"].items():
            if key not in value and "default" in sub:
                value[key] = copy.deepcopy(sub["default"])
            if key in value:
                value[key] = apply_defaults(sub, value[key])
    elif isinstance(value, list) and "items" in schema:
        return [apply_defaults(schema["items"], v) for v in value]
    return value


@functools.cache
def _program(rule: str):
    env = celpy.Environment()
    return env.program(env.compile(rule))


def cel_errors(schema: dict, value: Any, old: Any = None, path: str = "") -> list[str]:
    errors = []
    for r in schema.get("x-kubernetes-validations", []):
        if "oldSelf" in r["rule"] and old is None:
            continue  # transition rules run on updates only
        activation = {"self": celpy.json_to_cel(value)}
        if old is not None:
            activation["oldSelf"] = celpy.json_to_cel(old)
        result = _program(r["rule"]).evaluate(activation)
        if not bool(result) or isinstance(result, celpy.CELEvalError):
            errors.append(f"{path}{r.get('fieldPath', '')}: {r['message']}")
    if isinstance(value, dict):
        for key, sub in (schema.get("properties") or {}).items():
            if key in value:
                old_sub = old.get(key) if isinstance(old, dict) else None
                errors += cel_errors(sub, value[key], old_sub, f"{path}.{key}")
    elif isinstance(value, list) and "items" in schema:
        for i, item in enumerate(value):
            errors += cel_errors(schema["items"], item, None, f"{path}[{i}]")
    return errors


def admit(obj: dict, old: dict | None = None) -> tuple[dict, list[str]]:
    """(the defaulted object, errors as 'path: message')."""
    obj = apply_defaults(crd_schema(), copy.deepcopy(obj))
    validator = jsonschema.Draft4Validator(crd_schema())
    errors = [
        "." + ".".join(str(p) for p in e.absolute_path) + ": " + e.message
        for e in sorted(validator.iter_errors(obj), key=str)
    ]
    if not errors:
        errors = cel_errors(crd_schema(), obj, old)
    return obj, errors
