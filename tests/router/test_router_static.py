"""The static discovery file and the fleet it fills."""

from __future__ import annotations

import pytest

from pagoda.router.fleet import Endpoint, Fleet, GroupSpec
from pagoda.router.static import StaticDiscovery, parse_models


def test_a_static_file_fills_the_fleet(tmp_path):
    path = tmp_path / "models.yaml"
    path.write_text("""models:
  - name: m1
    aliases: [one, m1]
    endpoints: [http://10.0.0.1:8000/, http://10.0.0.2:8000]
    loadBalancing: {strategy: PrefixHash, prefixCharLength: 64}
  - name: m2
""")
    fleet = Fleet()
    discovery = StaticDiscovery(path)
    discovery.apply(fleet, discovery.load())
    m1 = fleet.lookup("one")
    assert m1 is fleet.lookup("m1")
    assert m1.spec == GroupSpec(key="m1", served_name="m1", aliases=("one", "m1"), strategy="PrefixHash",
                                prefix_char_length=64)
    assert m1.spec.names == ("m1", "one")
    assert [e.url for e in m1.endpoints] == ["http://10.0.0.1:8000", "http://10.0.0.2:8000"]
    assert m1.ready.is_set() and not fleet.lookup("m2").ready.is_set()

    path.write_text("models:\n  - name: m2\n    endpoints: [http://10.0.0.3:8000]\n")
    discovery.apply(fleet, discovery.load())
    assert fleet.lookup("m1") is None and fleet.lookup("one") is None
    assert fleet.lookup("m2").ready.is_set()


@pytest.mark.parametrize("doc,message", [
    ([], "models"),
    ({"models": [{"aliases": ["x"]}]}, r"models\[0\]\.name"),
    ({"models": [{"name": "a"}, {"name": "a"}]}, "appears twice"),
    ({"models": [{"name": "a", "endpoints": ["10.0.0.1:8000"]}]}, r"models\[0\]\.endpoints"),
    ({"models": [{"name": "a", "loadBalancing": {"strategy": "Random"}}]}, r"models\[0\]\.loadBalancing"),
    ({"models": [{"name": "a", "loadBalancing": {"prefixCharLength": 0}}]}, "prefixCharLength"),
])
def test_a_bad_static_file_is_rejected_naming_the_field(doc, message):
    with pytest.raises(ValueError, match=message):
        parse_models(doc)


def test_a_name_two_groups_claim_goes_to_the_first_by_key():
    fleet = Fleet()
    fleet.upsert(GroupSpec(key="ns/b", served_name="b", aliases=("shared",)))
    fleet.upsert(GroupSpec(key="ns/a", served_name="a", aliases=("shared",)))
    assert fleet.lookup("shared").spec.key == "ns/a"
    fleet.remove("ns/a")
    assert fleet.lookup("shared").spec.key == "ns/b"


def test_endpoints_seen_before_their_group_are_kept():
    """EndpointSlices may arrive before their ModelServer on a fresh watch."""
    fleet = Fleet()
    fleet.set_endpoints("ns/m", (Endpoint("http://10.0.0.9:8000"),))
    group = fleet.upsert(GroupSpec(key="ns/m", served_name="m"))
    assert [e.url for e in group.endpoints] == ["http://10.0.0.9:8000"] and group.ready.is_set()
