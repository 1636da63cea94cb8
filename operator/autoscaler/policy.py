"""The autoscaler's decision: how many replicas a ModelServer wants, from its replicas' queues.

This module is pure: no I/O, no clock. The timer (timer.py) scrapes, calls `decide`, and writes the
answer; tests drive `decide` directly with made-up figures and a made-up clock.

The formula (docs/autoscaling.md says the same in prose). Per tick, over the ready replicas:

    K, U   replicas that answered (known) and that did not (unknown)
    W, R   sum of num_requests_waiting and num_requests_running over the known replicas
    T      targetWaitingRequests: the queue one replica may hold
    N      current replicas (spec.replicas)

Scale up, in proportion to the queue. A replica with a queue is full, so what it runs is what one
replica holds right now; call c the mean running over the replicas that have a queue. One replica
then absorbs c running plus T waiting, and the demand W + R needs

    proposal = U + ceil((W + R) / (c + T))        (only when W > 0; otherwise proposal = N)

Each unknown replica counts as exactly one replica's worth: it never adds and never removes. When
every replica queues, proposal > K exactly when the mean queue W / K exceeds T. The proposal is
stabilised over `scaleUpStabilizationSeconds` by taking the smallest proposal in that window (as the
HPA does), so a one-tick spike does not scale; with the window at most one scrape interval a
sustained queue scales up on the second scrape at the latest.

Scale down, one step at a time. The running load fits in N - 1 replicas when R <= (N - 1) * C,
where C is what one replica holds: the most running requests any replica has shown while it had a
queue (exact, since a queued replica is full), learned over time; before any replica has queued,
the runtime's configured max_num_seqs; failing that, the most any replica has run (a lower bound,
so it errs towards keeping replicas). The replicas are calm when every ready replica answered, no
replica has a waiting request and the running load fits in N - 1. After `scaleDownDelaySeconds` of
unbroken calm at N replicas, desired = N - 1; the streak counts at one replica count only, so the
next step needs another full delay of calm observed on the smaller set.

Bounds come first: N below minReplicas or above maxReplicas is moved to the bound at once; every
answer lies in [minReplicas, maxReplicas]. The down rule stops at one replica even when
minReplicas is 0: at zero there is nothing to measure, so nothing would bring a replica back.
Unless `pagoda router` fronts the ModelServer: it holds requests for a ModelServer at zero, and
its queue (held and in-flight requests, `RouterLoad`) is measured at zero too. With it, a held
request takes N from 0 to max(minReplicas, 1), and the last replica goes after a full delay of calm
with nothing held or in flight at the router.

Why it does not oscillate under steady load: after a scale-up to P = ceil(L / (c + T)) for L
requests in flight, (P - 1) * C < L, so the calm rule cannot fire; after a step down to N - 1 with
L <= (N - 1) * C, no replica queues, so the up rule cannot fire.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pagoda.operator.spec import ScalingSpec

if TYPE_CHECKING:
    from pagoda.operator.spec import ModelServer

# The spec's camelCase keys and their defaults, from the CRD's own model (the single source).
DEFAULTS: dict[str, Any] = ScalingSpec().model_dump(by_alias=True, exclude={"mode"})


@dataclass(slots=True, frozen=True)
class ScalingParams:
    min_replicas: int
    max_replicas: int
    target_waiting_requests: float
    scrape_interval_seconds: float
    scale_up_stabilization_seconds: float
    scale_down_delay_seconds: float
    # What one replica runs at most (the runtime's --max-num-seqs), when the spec says so.
    max_num_seqs: int | None = None

    @classmethod
    def from_spec(cls, scaling: Mapping[str, Any] | None, max_num_seqs: int | None = None) -> ScalingParams:
        """From the ModelServer's `spec.scaling` dict (camelCase), missing keys taking DEFAULTS."""
        values = {**DEFAULTS, **{k: v for k, v in (scaling or {}).items() if v is not None}}
        min_replicas = int(values["minReplicas"])
        return cls(
            min_replicas=min_replicas,
            max_replicas=max(min_replicas, int(values["maxReplicas"])),
            target_waiting_requests=float(values["targetWaitingRequests"]),
            scrape_interval_seconds=float(values["scrapeIntervalSeconds"]),
            scale_up_stabilization_seconds=float(values["scaleUpStabilizationSeconds"]),
            scale_down_delay_seconds=float(values["scaleDownDelaySeconds"]),
            max_num_seqs=max_num_seqs,
        )

    @classmethod
    def from_model(cls, ms: ModelServer) -> ScalingParams:
        """From a parsed ModelServer: its scaling section, and what one replica runs at most."""
        scaling = ms.spec.scaling.model_dump(by_alias=True, exclude={"mode"})
        return cls.from_spec(scaling, max_num_seqs=ms.spec.engine.max_num_seqs)


@dataclass(slots=True, frozen=True)
class PodLoad:
    """One ready replica's figures; None for a replica that did not answer (unknown, not zero)."""

    name: str
    waiting: float | None
    running: float | None

    @property
    def known(self) -> bool:
        return self.waiting is not None and self.running is not None


@dataclass(slots=True, frozen=True)
class RouterLoad:
    """The router's queue for one ModelServer: requests held for a replica, and in flight."""

    held: float
    in_flight: float

    @property
    def idle(self) -> bool:
        return self.held == 0 and self.in_flight == 0


@dataclass(slots=True, frozen=True)
class ScalingState:
    """What the autoscaler remembers between ticks, per ModelServer."""

    # (time, proposal) for the ticks inside the scale-up stabilization window.
    proposals: tuple[tuple[float, int], ...] = ()
    # Since when the replicas have been calm without a break, at `calm_replicas` replicas.
    calm_since: float | None = None
    calm_replicas: int | None = None
    # Most running requests seen on one replica that had a queue: what one replica holds.
    learned_capacity: float | None = None
    # Most running requests seen on any one replica: a lower bound on what one replica holds.
    max_running_seen: float = 0.0


@dataclass(slots=True, frozen=True)
class Figures:
    """The numbers behind a decision; they go into the ModelServer's status."""

    current_replicas: int
    ready_replicas: int
    known_replicas: int
    unknown_replicas: int
    waiting_requests: float
    running_requests: float
    target_waiting_requests: float
    replica_capacity: float
    proposal: int
    calm_seconds: float

    def as_status(self) -> dict[str, Any]:
        return {_camel(f.name): getattr(self, f.name) for f in dataclasses.fields(self)}


@dataclass(slots=True, frozen=True)
class Decision:
    desired_replicas: int
    reason: str
    message: str
    figures: Figures
    state: ScalingState
    # False when the autoscaler could not measure anything and merely held the replica count.
    active: bool = True


def decide(
    pods: Sequence[PodLoad],
    current_replicas: int,
    params: ScalingParams,
    state: ScalingState,
    now: float,
    router: RouterLoad | None = None,
) -> Decision:
    """Desired replicas for one tick, with the reason, the figures and the next state. `router` is
    the router's queue for this ModelServer when a router fronts it and answered, else None."""
    n = current_replicas
    known = [p for p in pods if p.known]
    unknown = len(pods) - len(known)
    waiting = sum(p.waiting for p in known)
    running = sum(p.running for p in known)
    queued = [p for p in known if p.waiting > 0]

    learned = state.learned_capacity
    if queued:
        learned = max(learned or 0.0, max(p.running for p in queued))
    max_running_seen = max([state.max_running_seen, *(p.running for p in known)])
    capacity = max(learned or params.max_num_seqs or max_running_seen, 1.0)

    target = params.target_waiting_requests
    if waiting > 0:
        # A queued replica is full: what the queued replicas run now is what one replica holds now.
        current_capacity = sum(p.running for p in queued) / len(queued)
        per_replica = current_capacity + target
        proposal = (
            unknown + math.ceil((waiting + running) / per_replica) if per_replica > 0 else params.max_replicas
        )
    else:
        proposal = n
    window = params.scale_up_stabilization_seconds
    proposals = tuple((t, p) for t, p in state.proposals if now - t <= window) + ((now, proposal),)
    stabilized = min(p for _, p in proposals)

    calm = bool(known) and unknown == 0 and waiting == 0 and running <= (n - 1) * capacity
    # A streak counts only at one replica count: a step (ours or anyone's) starts it again.
    streak = state.calm_since if state.calm_replicas == n else None
    calm_since = (streak if streak is not None else now) if calm else None
    calm_seconds = now - calm_since if calm_since is not None else 0.0

    def answer(desired: int, reason: str, message: str, *, active: bool = True):
        figures = Figures(
            current_replicas=n,
            ready_replicas=len(pods),
            known_replicas=len(known),
            unknown_replicas=unknown,
            waiting_requests=waiting,
            running_requests=running,
            target_waiting_requests=target,
            replica_capacity=capacity,
            proposal=proposal,
            calm_seconds=round(calm_seconds, 3),
        )
        next_state = ScalingState(
            proposals=proposals,
            calm_since=calm_since,
            calm_replicas=n,
            learned_capacity=learned,
            max_running_seen=max_running_seen,
        )
        return Decision(desired, reason, message, figures, next_state, active)

    lo, hi = params.min_replicas, params.max_replicas
    if n < lo:
        return answer(lo, "BelowMinReplicas", f"{n} replicas is below minReplicas {lo}")
    if n > hi:
        return answer(hi, "AboveMaxReplicas", f"{n} replicas is above maxReplicas {hi}")
    if n == 0 and router is not None and router.held > 0:
        wake = max(lo, 1)
        return answer(wake, "RouterHolding", f"the router holds {router.held:g} requests: 0 -> {wake}")
    if n == 0 and router is not None:
        return answer(0, "ScaledToZero", "no replicas and nothing held: the router wakes it on a request")
    if not known:
        why = "no replica is ready" if not pods else f"none of {len(pods)} ready replicas answered"
        return answer(n, "MetricsUnavailable", f"holding {n} replicas: {why}", active=False)
    if stabilized > n:
        if n == hi:
            return answer(
                n, "AtMaxReplicas", f"queue of {waiting:g} wants {stabilized} replicas; at maxReplicas {hi}"
            )
        desired = min(stabilized, hi)
        return answer(
            desired, "QueueAboveTarget", f"{waiting:g} waiting, {running:g} running: {n} -> {desired}"
        )
    # The autoscaler never takes the last replica away: at zero there is nothing left to measure,
    # so nothing would bring it back (scale-to-zero is KEDA's, with its activation query).
    # ... unless the router fronts it and has nothing for it: the router wakes it again.
    to_zero = n == 1 and lo == 0 and router is not None and router.idle
    if calm and (n > max(lo, 1) or to_zero):
        if calm_seconds >= params.scale_down_delay_seconds:
            return answer(
                n - 1,
                "QueueEmpty",
                f"queue empty for {calm_seconds:.1f}s and {running:g} running fit in {n - 1}: {n} -> {n - 1}",
            )
        return answer(
            n,
            "ScaleDownDelayed",
            f"queue empty for {calm_seconds:.1f}s of {params.scale_down_delay_seconds:g}s",
        )
    if unknown:
        return answer(
            n, "ReplicasUnknown", f"{unknown} of {len(pods)} replicas did not answer; not scaling down"
        )
    if proposal > n:
        return answer(
            n,
            "ScaleUpStabilizing",
            f"queue of {waiting:g} wants {proposal}; waiting out the stabilization window",
        )
    return answer(n, "WithinTarget", f"{waiting:g} waiting, {running:g} running on {n} replicas")


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(w.title() for w in rest)
