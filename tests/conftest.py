"""Suite-wide: how pytest-xdist shares the tests out (make test runs it with --dist loadscope)."""

from __future__ import annotations

# Every module of these folders shares one session fixture that is expensive to build (tests/kube:
# a whole control plane), so they go to one worker together instead of one worker per module.
ONE_WORKER = ("tests/kube/",)


def pytest_xdist_make_scheduler(config, log):
    if config.getoption("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class SharedSessionScopes(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            for folder in ONE_WORKER:
                if nodeid.startswith(folder):
                    return folder
            return super()._split_scope(nodeid)

    return SharedSessionScopes(config, log)
