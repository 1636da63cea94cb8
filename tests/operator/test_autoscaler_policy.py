"""Properties of the autoscaler's decision (issue 8), over generated figures and clocks."""

from __future__ import annotations

import math

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pagoda.operator.autoscaler.policy import PodLoad, ScalingParams, ScalingState, decide

SETTINGS = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def params(draw, max_down_delay: float = 120.0):
    lo = draw(st.integers(1, 4))
    hi = draw(st.integers(lo, 12))
    interval = draw(st.sampled_from([1.0, 5.0, 10.0, 15.0]))
    return ScalingParams(
        min_replicas=lo,
        max_replicas=hi,
        target_waiting_requests=draw(st.sampled_from([0.5, 1.0, 2.0, 4.0, 8.0])),
        scrape_interval_seconds=interval,
        # Property 1 is promised for a window of at most one interval (docs/autoscaling.md).
        scale_up_stabilization_seconds=draw(st.sampled_from([0.0, interval / 2, interval])),
        scale_down_delay_seconds=draw(st.sampled_from([0.0, interval, 3 * interval, max_down_delay])),
        max_num_seqs=draw(st.sampled_from([None, 4, 64])),
    )


busy_figures = st.one_of(
    st.none(),  # did not answer
    st.tuples(st.integers(0, 30), st.integers(0, 16)),  # (waiting, running)
)
calm_figures = st.tuples(st.just(0), st.integers(0, 2))
tick_figures = st.one_of(
    st.lists(busy_figures, max_size=8),
    st.lists(calm_figures, min_size=1, max_size=8),  # weighted: calm runs are where scale-down lives
    st.lists(calm_figures, min_size=1, max_size=8),
    st.lists(calm_figures, min_size=1, max_size=8),
)


def pods_of(figures) -> list[PodLoad]:
    return [
        PodLoad(f"pod-{i}", None, None) if f is None else PodLoad(f"pod-{i}", float(f[0]), float(f[1]))
        for i, f in enumerate(figures)
    ]


@st.composite
def histories(draw, p: ScalingParams):
    """A random run of ticks: (seconds since the previous tick, the pods' figures)."""
    steps = draw(st.integers(1, 30))
    return [
        (
            draw(st.sampled_from([p.scrape_interval_seconds, p.scrape_interval_seconds * 1.01, 0.5, 30.0])),
            draw(tick_figures),
        )
        for _ in range(steps)
    ]


def run(p: ScalingParams, start: int, history):
    """Feed the ticks to decide(), following its answers; yields (time, replicas before, decision)."""
    state, replicas, now = ScalingState(), start, 1000.0
    for dt, figures in history:
        now += dt
        decision = decide(pods_of(figures), replicas, p, state, now)
        yield now, replicas, decision
        state, replicas = decision.state, decision.desired_replicas


def steady_pods(load: int, replicas: int, capacity: int) -> list[PodLoad]:
    """`load` requests in flight spread over the replicas; each runs at most `capacity`, queues the rest."""
    shares = [load // replicas + (1 if i < load % replicas else 0) for i in range(replicas)]
    return [
        PodLoad(f"pod-{i}", float(max(0, s - capacity)), float(min(s, capacity)))
        for i, s in enumerate(shares)
    ]


@SETTINGS
@given(st.data())
def test_answer_always_within_min_and_max(data):
    p = data.draw(params())
    start = data.draw(st.integers(0, 16))
    for _, _, decision in run(p, start, data.draw(histories(p))):
        assert p.min_replicas <= decision.desired_replicas <= p.max_replicas


@SETTINGS
@given(st.data())
def test_sustained_queue_scales_up_within_two_intervals_in_proportion(data):
    p = data.draw(params())
    replicas = data.draw(st.integers(p.min_replicas, p.max_replicas))
    capacity = data.draw(st.integers(1, 8))
    # Every replica full and queueing above the target, for as long as it takes.
    waiting = data.draw(st.integers(math.floor(p.target_waiting_requests) + 1, 40))
    busy = [PodLoad(f"pod-{i}", float(waiting), float(capacity)) for i in range(replicas)]
    idle = [PodLoad(f"pod-{i}", 0.0, float(capacity)) for i in range(replicas)]

    state = decide(idle, replicas, p, ScalingState(), now=0.0).state  # the tick before the queue
    first = decide(busy, replicas, p, state, now=p.scrape_interval_seconds)
    second = decide(busy, replicas, p, first.state, now=2 * p.scrape_interval_seconds)
    scaled = first if first.desired_replicas != replicas else second

    # Demand per replica over what one replica holds (capacity + target), for the whole set.
    wanted = replicas * (capacity + waiting) / (capacity + p.target_waiting_requests)
    assert scaled.desired_replicas >= min(p.max_replicas, math.ceil(wanted))
    assert scaled.desired_replicas <= p.max_replicas
    if replicas < p.max_replicas:
        assert scaled.reason == "QueueAboveTarget"
    else:
        assert scaled.reason == "AtMaxReplicas"


@SETTINGS
@given(st.data())
def test_deep_queue_adds_many_replicas_at_once(data):
    """In proportion to the queue, not one pod at a time."""
    p = ScalingParams(1, 100, data.draw(st.sampled_from([1.0, 2.0, 4.0])), 10.0, 0.0, 300.0)
    capacity = data.draw(st.integers(1, 8))
    replicas = data.draw(st.integers(1, 5))
    queue_per_replica = data.draw(st.integers(1, 6)) * (capacity + p.target_waiting_requests)
    pods = [PodLoad(f"pod-{i}", float(queue_per_replica), float(capacity)) for i in range(replicas)]
    decision = decide(pods, replicas, p, ScalingState(), now=0.0)
    # Each added replica takes what one replica holds (capacity + target) off the excess queue.
    excess = replicas * (queue_per_replica - p.target_waiting_requests)
    assert decision.desired_replicas - replicas >= math.floor(excess / (capacity + p.target_waiting_requests))
    if excess >= 2 * (capacity + p.target_waiting_requests):
        assert decision.desired_replicas - replicas >= 2


@SETTINGS
@given(st.data())
def test_never_scales_down_while_any_replica_waits_or_is_unknown(data):
    p = data.draw(params())
    start = data.draw(st.integers(p.min_replicas, p.max_replicas))
    for _, before, decision in run(p, start, data.draw(histories(p))):
        pods = decision.figures
        if pods.waiting_requests > 0 or pods.unknown_replicas > 0:
            assert decision.desired_replicas >= before, decision


@SETTINGS
@given(st.data())
def test_scales_down_one_step_only_after_the_delay_of_calm(data):
    p = data.draw(params())
    start = data.draw(st.integers(p.min_replicas, p.max_replicas))
    ticks = list(run(p, start, data.draw(histories(p))))
    for i, (now, before, decision) in enumerate(ticks):
        if decision.desired_replicas >= before:
            continue
        assert decision.desired_replicas == before - 1, "one step at a time"
        assert decision.reason == "QueueEmpty"
        # Walk back over the unbroken calm streak at this replica count: it spans the whole delay.
        streak_start = now
        for then, n, earlier in reversed(ticks[: i + 1]):
            f = earlier.figures
            calm = (
                n == before
                and f.known_replicas > 0
                and f.unknown_replicas == 0
                and f.waiting_requests == 0
                and f.running_requests <= (n - 1) * f.replica_capacity
            )
            if not calm or (then < now and earlier.desired_replicas != n):
                break
            streak_start = then
        assert now - streak_start >= p.scale_down_delay_seconds


@SETTINGS
@given(st.data())
def test_unknown_replica_restarts_the_scale_down_delay(data):
    """A silent replica is not an idle one: the delay counts again from when all answer."""
    delay = data.draw(st.sampled_from([10.0, 60.0]))
    p = ScalingParams(1, 6, 2.0, 5.0, 5.0, delay, max_num_seqs=4)
    replicas = data.draw(st.integers(2, 6))
    idle = [PodLoad(f"pod-{i}", 0.0, 0.0) for i in range(replicas)]
    silent = [PodLoad("pod-0", None, None), *idle[1:]]

    state = decide(idle, replicas, p, ScalingState(), now=0.0).state
    gap = decide(silent, replicas, p, state, now=delay - 1)
    assert gap.desired_replicas == replicas and gap.reason == "ReplicasUnknown"
    back = decide(idle, replicas, p, gap.state, now=delay + 1)
    assert back.desired_replicas == replicas  # calm only for 0s, not for `delay`
    later = decide(idle, replicas, p, back.state, now=2 * delay + 1)
    assert later.desired_replicas == replicas - 1


def test_all_replicas_silent_holds_and_reports_inactive():
    p = ScalingParams(1, 6, 2.0, 5.0, 5.0, 0.0)
    silent = [PodLoad(f"pod-{i}", None, None) for i in range(3)]
    decision = decide(silent, 3, p, ScalingState(), now=0.0)
    assert (decision.desired_replicas, decision.reason, decision.active) == (3, "MetricsUnavailable", False)


@SETTINGS
@given(
    load=st.integers(0, 200),
    capacity=st.integers(1, 16),
    target=st.sampled_from([0.5, 1.0, 2.0, 4.0]),
    start=st.integers(1, 12),
    configured=st.booleans(),
)
def test_steady_load_converges_without_oscillating(load, capacity, target, start, configured):
    p = ScalingParams(1, 12, target, 5.0, 5.0, 15.0, max_num_seqs=capacity if configured else None)
    state, replicas, history = ScalingState(), start, [start]
    for tick in range(60):
        decision = decide(steady_pods(load, replicas, capacity), replicas, p, state, now=5.0 * tick)
        state, replicas = decision.state, decision.desired_replicas
        history.append(replicas)
    steps = [b - a for a, b in zip(history, history[1:]) if b != a]
    # Monotone: never up then down, nor down then up.
    assert all(s > 0 for s in steps) or all(s < 0 for s in steps)
    # Settled: the last ten ticks changed nothing.
    assert len(set(history[-10:])) == 1
    final = history[-1]
    if final < p.max_replicas:  # settled because the demand fits, not because it gave up
        assert load <= final * (capacity + target)
    if final > p.min_replicas and configured:  # and no replica more than the running load needs
        assert load > (final - 1) * capacity


def test_figures_go_to_status_in_camel_case():
    p = ScalingParams(1, 4, 2.0, 5.0, 5.0, 60.0)
    pods = [PodLoad("a", 3.0, 2.0), PodLoad("b", None, None)]
    status = decide(pods, 2, p, ScalingState(), now=0.0).figures.as_status()
    assert status["waitingRequests"] == 3.0
    assert status["runningRequests"] == 2.0
    assert status["unknownReplicas"] == 1
    assert status["targetWaitingRequests"] == 2.0


def test_from_spec_fills_defaults_and_orders_bounds():
    p = ScalingParams.from_spec({"minReplicas": 3, "maxReplicas": 2, "targetWaitingRequests": None})
    assert (p.min_replicas, p.max_replicas) == (3, 3)
    assert p.target_waiting_requests > 0


def test_never_removes_the_last_replica_even_with_min_zero():
    """At zero nothing is left to measure, so nothing would bring a replica back."""
    p = ScalingParams(0, 4, 2.0, 5.0, 5.0, 0.0, max_num_seqs=4)
    state = ScalingState()
    replicas = 3
    for tick in range(10):
        decision = decide(steady_pods(0, replicas, 4), replicas, p, state, now=5.0 * tick)
        state, replicas = decision.state, decision.desired_replicas
    assert replicas == 1
    # And a ModelServer someone scaled to zero by hand stays there: no pods, nothing measured.
    held = decide([], 0, p, ScalingState(), now=0.0)
    assert (held.desired_replicas, held.reason) == (0, "MetricsUnavailable")
