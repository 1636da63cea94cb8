"""The ModelServer CRD: generated from the pydantic spec, valid for Kubernetes, and its schema and
CEL rules accept the examples and reject broken specs with messages that name the field."""

from __future__ import annotations

import copy
from pathlib import Path

import celpy
import kubernetes_validate
import pytest
import yaml
from broken_specs import BROKEN, minimal
from crd_check import admit, crd_schema
from hypothesis import given, settings
from hypothesis import strategies as st

from pagoda.operator import crdgen
from pagoda.operator.spec import ModelServer
from pagoda.runtime.model_uri import ModelURI

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples").glob("modelserver-*.yaml"))
K8S_VERSION = "1.37"



def test_checked_in_crd_matches_the_spec():
    for path, text in crdgen.outputs().items():
        assert path.read_text() == text, f"{path} drifted: run `python -m pagoda.operator.crdgen --write`"


def test_crd_is_a_valid_kubernetes_object():
    kubernetes_validate.validate(crdgen.build_crd(), K8S_VERSION, strict=True)


def test_crd_shape():
    version = crdgen.build_crd()["spec"]["versions"][0]
    columns = [c["name"].upper() for c in version["additionalPrinterColumns"]]
    assert columns == ["MODEL", "READY", "DESIRED", "WAITING", "PHASE", "AGE"]
    assert version["subresources"]["status"] == {}
    assert version["subresources"]["scale"]["labelSelectorPath"] == ".status.selector"


def _rules(node):
    if isinstance(node, dict):
        yield from node.get("x-kubernetes-validations", [])
        for value in node.values():
            yield from _rules(value)
    elif isinstance(node, list):
        for value in node:
            yield from _rules(value)


def test_every_cel_rule_compiles_and_names_a_field():
    env = celpy.Environment()
    rules = list(_rules(crd_schema()))
    assert len(rules) >= 6
    for r in rules:
        env.compile(r["rule"])
        assert "." in r["message"] or "metadata.name" in r["message"], r


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_examples_are_admitted(path):
    obj = yaml.safe_load(path.read_text())
    defaulted, errors = admit(obj)
    assert errors == []
    # The operator reads the defaulted object with the same models the CRD came from.
    ms = ModelServer.from_body(defaulted)
    assert ms.spec.model.uri == obj["spec"]["model"]["uri"]


def test_defaults_reach_nested_fields():
    defaulted, errors = admit(minimal())
    assert errors == []
    spec = defaulted["spec"]
    assert spec["replicas"] == 1 and spec["resources"]["gpus"] == 1
    assert spec["engine"]["gpuMemoryUtilization"] == 0.9
    assert spec["cache"] == {
        "enabled": True,
        "size": "100Gi",
        "accessMode": "ReadWriteOnce",
        "retainOnDelete": True,
    }
    assert spec["scaling"]["mode"] == "operator" and spec["scaling"]["targetWaitingRequests"] == 4.0


@pytest.mark.parametrize("case", BROKEN, ids=list(BROKEN))
def test_broken_specs_are_rejected_naming_the_field(case):
    mutate, field = BROKEN[case]
    obj = minimal()
    mutate(obj["spec"])
    _, errors = admit(obj)
    assert errors, f"{case} was admitted"
    assert any(field in e for e in errors), errors


def test_name_must_fit_the_owned_objects():
    obj = minimal()
    obj["metadata"]["name"] = "x" * 46
    assert any("metadata.name" in e for e in admit(obj)[1])
    obj["metadata"]["name"] = "9starts-with-digit"
    assert any("metadata.name" in e for e in admit(obj)[1])


def _loaded(obj: dict) -> dict:
    old, errors = admit(obj)
    assert errors == []
    old["status"] = {"cache": {"ready": True, "uri": obj["spec"]["model"]["uri"]}}
    return old


@pytest.mark.parametrize(
    "field,value",
    [
        ("storageClassName", "fast"),
        ("accessMode", "ReadWriteMany"),
        ("existingClaim", "mine"),
        ("enabled", False),
    ],
)
def test_cache_fields_are_immutable_once_loaded(field, value):
    old = _loaded(minimal())
    new = copy.deepcopy(old)
    new["spec"]["cache"][field] = value
    _, errors = admit(new, old)
    assert any("spec.cache" in e and "immutable" in e for e in errors), errors
    # Before the cache is loaded the same change is fine.
    del old["status"]
    assert admit(new, old)[1] == []


def test_other_changes_pass_once_loaded():
    old = _loaded(minimal())
    new = copy.deepcopy(old)
    new["spec"]["cache"]["retainOnDelete"] = False
    new["spec"]["cache"]["size"] = "500Gi"  # the claim is expanded
    new["spec"]["replicas"] = 0
    new["spec"]["model"]["uri"] = "hf://Qwen/Qwen2.5-1.5B-Instruct"
    assert admit(new, old)[1] == []


URI_ALPHABET = "hfpvc:/@.-_aZ09 \t\n"


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.text(URI_ALPHABET, max_size=24), st.text(URI_ALPHABET, max_size=20).map(lambda t: "hf://" + t),
                 st.text(URI_ALPHABET, max_size=20).map(lambda t: "pvc://" + t)))
def test_crd_uri_rules_admit_exactly_what_the_parser_accepts(uri):
    """The CEL rules (cel-python, RE2-compatible patterns) and ModelURI.parse agree on every URI."""
    obj = minimal()
    obj["spec"]["model"]["uri"] = uri
    admitted = not [e for e in admit(obj)[1] if "model.uri" in e]
    try:
        ModelURI.parse(uri)
        parsed = True
    except ValueError:
        parsed = False
    assert admitted == parsed, uri
