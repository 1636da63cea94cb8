"""The timer's status writes: its own fields and condition, without clobbering the reconcile's."""

from __future__ import annotations

from pagoda.operator.autoscaler.policy import PodLoad, ScalingParams, ScalingState, decide
from pagoda.operator.autoscaler.timer import delegated_patch, fixed_patch, status_patch
from pagoda.operator.spec import ModelServer

EARLIER, NOW = "2026-01-01T00:00:00Z", "2026-01-01T00:05:00Z"
RECONCILE_CONDITIONS = [
    {"type": "CacheReady", "status": "True", "reason": "Loaded", "message": "", "lastTransitionTime": EARLIER},
    {"type": "Available", "status": "True", "reason": "MinimumReplicasAvailable", "message": "1/1",
     "lastTransitionTime": EARLIER},
]  # fmt: skip


def modelserver(mode: str = "operator") -> ModelServer:
    return ModelServer.from_body(
        {
            "metadata": {"name": "m", "namespace": "ns", "uid": "u", "generation": 4},
            "spec": {"model": {"uri": "hf://org/m"}, "scaling": {"mode": mode, "maxReplicas": 4}},
            "status": {"conditions": RECONCILE_CONDITIONS},
        }
    )


def test_status_patch_keeps_other_conditions_and_reports_the_figures():
    ms = modelserver()
    p = ScalingParams.from_model(ms)
    decision = decide([PodLoad("a", 9.0, 2.0)], 1, p, ScalingState(), now=0.0)
    current = {"conditions": RECONCILE_CONDITIONS}
    patch = status_patch(ms, current, decision, NOW, scaled=True)

    by_type = {c["type"]: c for c in patch["conditions"]}
    assert by_type["CacheReady"] == RECONCILE_CONDITIONS[0]
    assert by_type["Available"] == RECONCILE_CONDITIONS[1]
    scaling = by_type["ScalingActive"]
    assert (scaling["status"], scaling["reason"]) == ("True", "QueueAboveTarget")
    assert scaling["observedGeneration"] == 4
    assert patch["desiredReplicas"] == decision.desired_replicas > 1
    assert patch["lastScaleTime"] == NOW
    assert patch["waitingRequests"] == 9.0
    assert patch["autoscaling"]["runningRequests"] == 2.0

    # The next tick, nothing scaled: no lastScaleTime, and the transition time stays put.
    later = status_patch(
        ms, {"conditions": patch["conditions"]}, decision, "2026-01-01T00:06:00Z", scaled=False
    )
    assert "lastScaleTime" not in later
    assert next(c for c in later["conditions"] if c["type"] == "ScalingActive")["lastTransitionTime"] == NOW


def test_no_measurement_reports_scaling_inactive_without_a_queue_figure():
    ms = modelserver()
    decision = decide([PodLoad("a", None, None)], 1, ScalingParams.from_model(ms), ScalingState(), now=0.0)
    patch = status_patch(ms, {}, decision, NOW, scaled=False)
    (condition,) = patch["conditions"]
    assert (condition["status"], condition["reason"]) == ("False", "MetricsUnavailable")
    assert "waitingRequests" not in patch  # unknown is not zero


def test_hpa_and_keda_modes_say_who_scales():
    for mode, reason in (("hpa", "DelegatedToHPA"), ("keda", "DelegatedToKEDA")):
        patch = delegated_patch(modelserver(mode), {"conditions": RECONCILE_CONDITIONS}, NOW)
        scaling = next(c for c in patch["conditions"] if c["type"] == "ScalingActive")
        assert (scaling["status"], scaling["reason"]) == ("Unknown", reason)
        assert len(patch["conditions"]) == 3
        assert patch["autoscaling"] == {"mode": mode}


def test_equal_min_and_max_leave_spec_replicas_alone():
    body = {"metadata": {"name": "m", "namespace": "ns", "uid": "u", "generation": 1},
            "spec": {"model": {"uri": "hf://org/m"}, "replicas": 3}}  # fmt: skip
    ms = ModelServer.from_body(body)
    assert ms.spec.scaling.min_replicas == ms.spec.scaling.max_replicas
    patch = fixed_patch(ms, {"conditions": RECONCILE_CONDITIONS}, NOW)
    scaling = next(c for c in patch["conditions"] if c["type"] == "ScalingActive")
    assert (scaling["status"], scaling["reason"]) == ("False", "FixedReplicas")
    assert patch["autoscaling"] == {"mode": "fixed"}
