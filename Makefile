# gpuops: `make demo` runs the demo scenario on the emulated cluster with our operator; `make test` installs and
# tests. `DEMO_SECONDS=60 make demo` ends the demo after 60 s with a report.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
DEMO_STAMP := $(VENV)/.installed-demo
QUICK  ?=
export DEMO_SECONDS

.PHONY: install test lint typecheck unit demo bench chaos clean lock readme manifests mutation

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

# Reinstall whenever the dependency declarations change; constraints.txt pins what CI gets. The full install
# (the test toolchain too) also satisfies the demo's, which is a subset of it.
$(STAMP): pyproject.toml sim/pyproject.toml constraints.txt | $(BIN)/python
	$(BIN)/python -m pip install --quiet -c constraints.txt -e '.[test]' -e './sim[demo]'
	touch $(STAMP) $(DEMO_STAMP)

install: $(STAMP)

# `make demo` installs only what the demo runs (the operator with its MIG extra, and the emulator, sim/, with its
# "demo" extra), so a first run shows the live view without waiting for the test toolchain; `make test` adds the
# rest later.
$(DEMO_STAMP): pyproject.toml sim/pyproject.toml constraints.txt | $(BIN)/python
	$(BIN)/python -m pip install --quiet -c constraints.txt -e '.[mig]' -e './sim[demo]'
	touch $(DEMO_STAMP)

lint: install
	$(BIN)/ruff check gpuops sim tests bench chaos
	$(BIN)/hadolint --failure-threshold warning Dockerfile

typecheck: install
	$(BIN)/mypy --strict gpuops sim/gpuops_sim

# Two workers, grouped by tests/conftest.py. A worker that crashes (a C extension's segfault) ends the run with that
# test failed: pytest-xdist's replacement of a crashed worker can leave a grouped run waiting forever. The timeout
# (SIGINT: pytest still prints its summary) is the last guard against any other hang.
XDIST := -n 2 --dist loadgroup --max-worker-restart=0
unit: install
	timeout --signal=INT --kill-after=60 1500 $(BIN)/python -m pytest -q -p no:cacheprovider --durations=30 $(XDIST)

test: lint typecheck unit

demo: $(DEMO_STAMP)
	$(BIN)/gpuops demo --kubeconfig $(CURDIR)/demo.kubeconfig --scenario demo

# A full run (no QUICK) also refreshes the README's generated tables from the new results.
bench: install
	@set -e; for s in bench/[!_]*.py; do echo "== $$s"; $(BIN)/python $$s $(QUICK); done
	@[ -n "$(QUICK)" ] || $(BIN)/python tests/readme_sections.py

# The CRDs in manifests/crds are generated from the API types (gpuops/controllers/*/api.py); the README's CRD
# reference is generated from them in turn. tests/test_crds_generated.py fails when either is stale.
manifests: install
	$(BIN)/python -m gpuops.controllers.crds manifests/crds
	$(BIN)/python tests/readme_sections.py

# The README's generated blocks: benchmark headlines, chaos summary, CRD reference (tests/test_readme.py checks).
readme: install
	$(BIN)/python tests/readme_sections.py

# Every scenario runs even if one fails (each writes its results); the target fails if any did. A full run
# also refreshes the README's generated tables.
# `make chaos SCENARIO=budget_evict` runs one.
SCENARIO ?= [!_]*
chaos: install
	@failed=""; for s in chaos/$(SCENARIO).py; do [ -e "$$s" ] || { echo "no chaos scenario $$s"; exit 2; }; \
	  echo "== $$s"; $(BIN)/python $$s $(QUICK) || failed="$$failed $$s"; done; \
	  [ -n "$(QUICK)" ] || $(BIN)/python tests/readme_sections.py; \
	  for s in $$failed; do n=$$(basename $$s .py); echo "== $$s failed:"; \
	    tail -n 30 chaos/results/$(if $(QUICK),quick/)$$n.md; done; \
	  [ -z "$$failed" ] || { echo "chaos scenarios FAILED:$$failed (see chaos/results/$(if $(QUICK),quick/)SUMMARY.md)"; exit 1; }

# Mutation testing of the budget guarantees (config: [tool.mutmut] in pyproject.toml). mutmut is installed by this
# target only, so `make test` never pays for it; a run takes hours (every mutant runs the budget tests against the
# emulated cluster), so it is not part of CI. Results stay in mutants/ (git-ignored); tests/mutation_report.py
# prints the score per file and the surviving mutants. MUTATION_JOBS: mutants in parallel; MUTANTS: mutant-name
# globs (default: the accounting code whole; the budget controller's ledger, finalizer release and eviction code).
MUTMUT        := mutmut==3.8.1
MUTMUT_STAMP  := $(VENV)/.mutmut-installed
MUTATION_JOBS ?= 2
CONTRACT      := gpuops.controllers.budget.podcontract
LEDGER        := gpuops.controllers.budget.ledger
RECON         := gpuops.controllers.budget.reconciler.xǁBudgetReconcilerǁ
ENFORCER      := gpuops.controllers.budget.enforcement.xǁEnforcerǁ
MUTANTS       ?= 'gpuops.accounting.gpuhours.*' 'gpuops.accounting.reporting.*' \
                 '$(CONTRACT).x_counted_end__mutmut_*' '$(CONTRACT).x_departed_entry__mutmut_*' \
                 '$(CONTRACT).x__settled__mutmut_*' \
                 '$(LEDGER).x_recorded__mutmut_*' '$(LEDGER).x_compact__mutmut_*' '$(LEDGER).xǁBookǁcovers__mutmut_*' \
                 '$(LEDGER).x_ledger_from_status__mutmut_*' '$(LEDGER).x_ledger_to_status__mutmut_*' \
                 '$(LEDGER).x__entry_from_status__mutmut_*' \
                 '$(RECON)_stop_counting__mutmut_*' '$(RECON)map_deleted_pod__mutmut_*' '$(RECON)prune_departed__mutmut_*' \
                 '$(RECON)_forget_departed__mutmut_*' '$(RECON)_needers__mutmut_*' '$(RECON)_release__mutmut_*' \
                 '$(ENFORCER)_evict__mutmut_*' '$(ENFORCER)_evict_one__mutmut_*' '$(ENFORCER)_unstop__mutmut_*' \
                 '$(ENFORCER)_refused__mutmut_*' '$(ENFORCER)_evicted__mutmut_*' '$(ENFORCER)vanished_end__mutmut_*' \
                 '$(ENFORCER)forget_stop__mutmut_*'

$(MUTMUT_STAMP): $(STAMP)
	$(BIN)/python -m pip install --quiet -c constraints.txt '$(MUTMUT)'
	touch $(MUTMUT_STAMP)

mutation: $(MUTMUT_STAMP)
	$(BIN)/mutmut run --max-children $(MUTATION_JOBS) $(MUTANTS)
	$(BIN)/python tests/mutation_report.py

# Refresh constraints.txt from the current virtualenv (run after changing dependencies).
lock: | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[test]'
	$(BIN)/python -m pip freeze --exclude-editable | grep -v '^gpuops' > constraints.txt

clean:
	@for kc in *.kubeconfig; do [ ! -e "$$kc.pid" ] || [ ! -x $(BIN)/gpuops ] || $(BIN)/gpuops sim down --kubeconfig "$$kc"; done
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache mutants demo-operator.log demo-agents.log demo-report \
	  *.kubeconfig *.kubeconfig.pid *.kubeconfig.log

# Regenerate the committed kubelet device-plugin gRPC modules from api.proto (`make test` never needs protoc).
DEVICEPLUGIN := gpuops/kube/deviceplugin
.PHONY: proto
proto: install
	$(BIN)/python -m grpc_tools.protoc -I$(DEVICEPLUGIN) --python_out=$(DEVICEPLUGIN) --grpc_python_out=$(DEVICEPLUGIN) \
	  $(DEVICEPLUGIN)/api.proto
	sed -i 's/^import api_pb2 as api__pb2$$/from . import api_pb2 as api__pb2/' $(DEVICEPLUGIN)/api_pb2_grpc.py
