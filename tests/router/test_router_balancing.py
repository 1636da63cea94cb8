"""The load-balancing strategies, on their own: CHWBL's consistency and bound, LeastLoad's choice,
the prompt prefix they hash, and the queue gauges read from a replica's /metrics page."""

from __future__ import annotations

import collections
import math
import random

import pytest

from pagoda.router.balancing import Balancer
from pagoda.router.chwbl import HashRing
from pagoda.router.fleet import Endpoint, Fleet, GroupSpec
from pagoda.router.load import Loads, parse_queue
from pagoda.router.prefix import prefix_key

MEMBERS = [f"http://10.0.0.{i}:8000" for i in range(1, 5)]


def test_a_key_keeps_its_member_while_loads_are_even():
    ring = HashRing(MEMBERS)
    keys = [f"system prompt {i}" for i in range(200)]
    first = [ring.pick(k, lambda m: 0) for k in keys]
    assert [ring.pick(k, lambda m: 0) for k in keys] == first
    # 200 keys over 4 members, 256 points each: every member owns a fair share.
    counts = collections.Counter(first)
    assert set(counts) == set(MEMBERS) and min(counts.values()) > 25


def test_removing_a_member_moves_only_its_keys():
    keys = [f"k{i}" for i in range(400)]
    before = {k: HashRing(MEMBERS).pick(k, lambda m: 0) for k in keys}
    after = {k: HashRing(MEMBERS[:-1]).pick(k, lambda m: 0) for k in keys}
    moved = [k for k in keys if before[k] != after[k]]
    assert moved and all(before[k] == MEMBERS[-1] for k in moved)


def test_placement_respects_the_bound_even_for_one_hot_key():
    """Every request shares one prefix: CHWBL spills, and no member exceeds ceil(c * mean)."""
    ring = HashRing(MEMBERS)
    loads = collections.Counter()
    for placed in range(100):
        member = ring.pick("the one system prompt", loads.__getitem__, 1.25)
        bound = math.ceil(1.25 * (placed + 1) / len(MEMBERS))
        loads[member] += 1
        assert loads[member] <= bound
    assert max(loads.values()) <= math.ceil(1.25 * 100 / 4)


def test_a_spilled_key_spills_to_the_same_next_member():
    ring = HashRing(MEMBERS)
    home = ring.pick("p", lambda m: 0)
    spill = ring.pick("p", lambda m: 10 if m == home else 0)
    assert spill != home
    assert ring.pick("p", lambda m: 10 if m == home else 0) == spill


def _group(strategy, n=3):
    fleet = Fleet()
    fleet.upsert(GroupSpec(key="ns/m", served_name="m", strategy=strategy))
    fleet.set_endpoints("ns/m", tuple(Endpoint(u) for u in MEMBERS[:n]))
    return fleet.lookup("m")


def test_least_load_adds_what_was_sent_since_the_scrape():
    loads = Loads()
    group = _group("LeastLoad")
    a, b, c = (e.url for e in group.endpoints)
    loads.record_scrape(a, 5.0)  # busy with other clients' requests
    loads.record_scrape(b, 1.0)
    loads.record_scrape(c, None)  # did not answer: its own in-flight count stands
    balancer = Balancer(loads)
    with loads.track(c), loads.track(c):
        assert loads.load(c) == 2
        with loads.track(b), loads.track(b):  # sent since b's scrape: 1 + 2
            assert loads.load(b) == 3.0
            assert balancer.pick(group, "").url == c
        assert balancer.pick(group, "").url == b


def test_least_load_turns_between_equals_and_skips_excluded():
    balancer = Balancer(Loads())
    group = _group("LeastLoad")
    picks = {balancer.pick(group, "").url for _ in range(6)}
    assert picks == {e.url for e in group.endpoints}
    assert balancer.pick(group, "", exclude={e.url for e in group.endpoints}) is None


def test_prefix_hash_sends_a_shared_prefix_to_one_replica():
    balancer = Balancer(Loads())
    group = _group("PrefixHash", n=4)
    rng = random.Random(0)
    systems = [f"You are assistant number {i}. " * 8 for i in range(8)]
    homes = collections.defaultdict(set)
    for _ in range(200):
        i = rng.randrange(8)
        body = {"messages": [{"role": "system", "content": systems[i]},
                             {"role": "user", "content": f"question {rng.random()}"}]}
        homes[i].add(balancer.pick(group, prefix_key(body, 100)).url)
    assert all(len(h) == 1 for h in homes.values())  # idle fleet: no spills
    assert len(set().union(*homes.values())) > 1  # and the prompts are spread


@pytest.mark.parametrize("body,want", [
    ({"prompt": "abcdef"}, "abc"),
    ({"prompt": ["abcdef", "zzz"]}, "abc"),
    ({"prompt": [5, 6, 7, 8]}, "5,6,7"),
    ({"prompt": [[5, 6, 7, 8]]}, "5,6,7"),
    ({"input": "abcdef"}, "abc"),
    ({"messages": [{"role": "system", "content": "abcdef"}]}, "sys"),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]}, "use"),
    ({"prompt": None}, ""),
])
def test_prefix_key(body, want):
    assert prefix_key(body, 3) == want


def test_chat_prefix_includes_the_system_prompt_first():
    body = {"messages": [{"role": "system", "content": "S" * 50}, {"role": "user", "content": "U" * 50}]}
    assert prefix_key(body, 20) == "system:" + "S" * 13


PAGE = """# TYPE {p}num_requests_running gauge
{p}num_requests_running{{model_name="m"}} 3.0
# TYPE {p}num_requests_waiting gauge
{p}num_requests_waiting{{model_name="m"}} 4.0
"""


@pytest.mark.parametrize("prefix", ["pagoda:", "vllm:"])
def test_queue_gauges_are_read_under_either_prefix(prefix):
    assert parse_queue(PAGE.format(p=prefix)) == 7.0


def test_a_page_without_the_gauges_is_unknown():
    assert parse_queue("# TYPE other gauge\nother 1\n") is None


def test_group_spec_rejects_an_unknown_strategy():
    with pytest.raises(ValueError, match="strategy"):
        GroupSpec(key="k", served_name="m", strategy="Random")
