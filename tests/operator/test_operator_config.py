"""OperatorConfig: every operator setting read from the chart's environment in one place, flags
over the environment, and the installed config what the handlers and the autoscaler use."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

from pagoda.operator.config import ENV, OperatorConfig


def test_every_setting_has_one_env_var_and_reads_back():
    names = [f.name for f in dataclasses.fields(OperatorConfig)]
    assert sorted(ENV) == sorted(names) and len(set(ENV.values())) == len(ENV)
    env = {
        "PAGODA_RUNTIME_IMAGE": "img:1", "PAGODA_RESYNC_SECONDS": "5", "PAGODA_RETRY_BASE_SECONDS": "2",
        "PAGODA_RETRY_MAX_SECONDS": "60", "PAGODA_CLUSTER_DOMAIN": "svc.cluster.local", "PAGODA_API_TIMEOUT_SECONDS": "9",
        "PAGODA_AUTOSCALER_SCRAPE_TIMEOUT_SECONDS": "3",
        "PAGODA_ROUTER_METRICS_URL": "http://router:8080/metrics", "PAGODA_PROMETHEUS_ADDRESS": "http://prom:9090",
        "PAGODA_PEERING_LIFETIME_SECONDS": "6",
    }  # fmt: skip
    assert set(env) == set(ENV.values())
    config = OperatorConfig.from_env(env)
    assert config == OperatorConfig(
        runtime_image="img:1", resync_seconds=5.0, retry_base_seconds=2.0, retry_max_seconds=60.0,
        cluster_domain="svc.cluster.local", api_timeout_seconds=9.0, scrape_timeout_seconds=3.0,
        router_metrics_url="http://router:8080/metrics", prometheus_address="http://prom:9090",
        peering_lifetime_seconds=6.0,
    )  # fmt: skip
    # Unset (or empty) variables keep the defaults; flags left unset keep what the environment said.
    assert OperatorConfig.from_env({"PAGODA_ROUTER_METRICS_URL": ""}) == OperatorConfig()
    assert config.with_overrides(runtime_image=None, resync_seconds=7.0).resync_seconds == 7.0
    assert config.with_overrides(runtime_image=None).runtime_image == "img:1"


def test_installed_config_sets_the_timers_intervals():
    """What `pagoda operator` installs before importing the handlers is what their timers tick at,
    with no environment variable involved."""
    code = (
        "import kopf\n"
        "from pagoda.operator import config\n"
        "config.install(config.OperatorConfig(resync_seconds=12.5))\n"
        "import pagoda.operator.handlers\n"
        "spawning = {h.id: h for h in kopf.get_default_registry()._spawning.get_all_handlers()}\n"
        "assert 12.5 in [getattr(h, 'interval', None) for h in spawning.values()], spawning\n"
        "assert type(spawning['autoscaler']).__name__ == 'DaemonHandler', spawning  # paced by each spec\n"
    )
    env = {k: v for k, v in __import__("os").environ.items() if k not in ENV.values()}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert result.returncode == 0, result.stderr
