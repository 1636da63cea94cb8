# The README's commands. Each target installs what it needs into .venv first.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.installed
DEMO_MODEL ?= e2e/demo-model
PORT ?= 8000

.PHONY: install test lint demo crds clean kube

# Bytecode is cached even where the environment asks not to (PYTHONDONTWRITEBYTECODE=1 on the CI
# machines): without it every test worker re-runs pytest's assertion rewriting of ~660 modules and
# every `pagoda serve` the tests start compiles the package from source, about 6 s a worker.
unexport PYTHONDONTWRITEBYTECODE

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip

# torch is pinned and installed first: the CPU build lies on disk, and any looser requirement
# would pull a CUDA build of several GB.
$(STAMP): $(PY) pyproject.toml setup.py
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -e '.[runtime,bench,operator,router,test]'
	touch $(STAMP)

install: $(STAMP)

lint: $(STAMP)
	$(VENV)/bin/ruff check .

# The Kubernetes control plane for tests/kube (e2e/kube/README.md): built from the Go module proxy
# into .cache/kube/ (a cold build takes about 10 minutes on 2 cores), found there afterwards.
kube:
	e2e/kube/build.sh

# pytest exits 5 when it collects no tests; that is a broken suite, not a pass, so say so and fail.
# The suite runs on one worker per core plus one (at most 4; tests/conftest.py says why), each test
# module whole on one worker, so module fixtures are built once and a module's tests keep their
# order (tests/kube and tests/router whole on one worker each); the slowest tests are listed.
PYTEST_FLAGS ?= -n auto --maxprocesses 4 --dist loadscope --durations 15
test: $(STAMP) kube
	$(VENV)/bin/ruff check .
	TRITON_INTERPRET=1 $(VENV)/bin/pytest -q $(PYTEST_FLAGS) tests; rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "make test: pytest collected no tests" >&2; fi; exit $$rc

demo: $(STAMP)
	$(PY) -m pagoda.runtime.tools.demo --model $(DEMO_MODEL) --port $(PORT)

crds: $(STAMP)
	$(PY) -m pagoda.operator.crdgen --write

clean:
	rm -rf $(VENV) .pytest_cache
