# treadle — the two README commands are `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: install demo test test-fast services lint typecheck bench test-chaos clean

# uv (parallel downloads) when it can be installed, pip otherwise
install_cmd = if [ -x $(BIN)/uv ]; then $(BIN)/uv pip install -q --python $(BIN)/python $(1); \
              else $(BIN)/pip install -q --disable-pip-version-check $(1); fi

$(BIN)/python:
	@$(PYTHON) -m venv $(VENV)
	@$(BIN)/pip install -q --disable-pip-version-check uv >/dev/null 2>&1 || true

$(BIN)/.runtime: pyproject.toml | $(BIN)/python
	@$(call install_cmd,-e .)
	@touch $@

$(BIN)/.installed: pyproject.toml $(BIN)/.runtime
	@$(call install_cmd,-e ".[dev]")
	@touch $@

install: $(BIN)/.installed

demo: $(BIN)/.runtime  ## a demo run end to end in embedded mode, transcript printed
	@mkdir -p .treadle && rm -f .treadle/demo.db*
	@TREADLE_LOG_LEVEL=WARNING TREADLE_DATABASE_URL=sqlite:///.treadle/demo.db $(BIN)/treadle demo

services:  ## PostgreSQL and Redis reachable (started when installed and down); system tools
	@bash .ci/services.sh || [ -z "$$CI" ]
	@bash .ci/system-deps.sh

# tests that use no shared service state and no real worker run on 2 processes (xdist; each test
# has its own PostgreSQL database, each process its own Redis database, servers free ports); the
# ones with real workers, SIGKILLs, restarts or timing figures run after them (below)
PARALLEL_TESTS := tests/unit tests/llm tests/tools tests/store tests/engine tests/api tests/interop \
                  tests/security/test_tenancy.py \
                  tests/security/test_agents_tenancy.py tests/security/test_guarded_routes.py \
                  tests/security/test_mcp_policy.py tests/security/test_approvals_api.py \
                  tests/security/test_hostile_input.py tests/e2e/test_cli.py \
                  tests/e2e/test_console_resume.py tests/e2e/test_embedded_events.py \
                  tests/e2e/test_embedded_lifecycle.py tests/e2e/test_embedded.py \
                  tests/security/test_ssrf.py tests/security/test_secrets.py \
                  tests/deploy/test_manifests.py
# the API fuzz (schemathesis) runs in a process of its own, beside the real-worker tests: it
# uses one core, and collecting it builds its coverage cases (~1 min), which every xdist
# process would do again
FUZZ_TESTS := tests/security/test_fuzz.py
# the real-worker tests mostly wait (worker boots, leases, timers: a load of ~1 on 2 cores), so
# they run two files at a time (each xdist process has its own database and Redis database);
# these run alone: the chaos storm restarts PostgreSQL, a fork bomb takes the CPU for its
# sandbox's limit, the others hold takeovers and re-drives to a time target of a few leases
SOLO_TESTS := tests/chaos tests/services/test_takeover.py tests/services/test_redrive_workers.py \
              tests/services/test_partition.py tests/security/test_limits.py
TEST_PROCS ?= 2

test: install services  ## the whole suite: the parallel part; the real-worker part two files at a time, the API fuzz beside it; the solo part
	@$(BIN)/pytest -q -p no:cacheprovider -n $(TEST_PROCS) --durations=10 $(PARALLEL_TESTS)
	@mkdir -p .treadle && rm -f .treadle/fuzz.log; \
	$(BIN)/pytest -q -p no:cacheprovider --durations=5 $(FUZZ_TESTS) >.treadle/fuzz.log 2>&1 & fuzz=$$!; \
	$(BIN)/pytest -q -p no:cacheprovider -n $(TEST_PROCS) --dist loadfile --durations=15 tests \
	  $(addprefix --ignore=,$(PARALLEL_TESTS) $(FUZZ_TESTS) $(SOLO_TESTS)); workers=$$?; \
	wait $$fuzz; fuzzed=$$?; echo "--- $(FUZZ_TESTS) (run beside the real-worker tests):"; \
	cat .treadle/fuzz.log; [ $$workers -eq 0 ] && [ $$fuzzed -eq 0 ]
	@$(BIN)/pytest -q -p no:cacheprovider --durations=15 $(SOLO_TESTS)

test-fast: install  ## without the real-service and end-to-end tests
	@$(BIN)/pytest -q -n $(TEST_PROCS) tests/unit tests/llm tests/tools tests/engine tests/api

test-chaos: install services  ## the crash-safety storm alone (CHAOS_RUNS, CHAOS_KILLS, CHAOS_SEED, CHAOS_BROKERS=redis,rabbitmq)
	@$(BIN)/pytest -q -s -p no:cacheprovider tests/chaos

bench: install services  ## the benchmarks side by side with their floor: bench/results/latest.md
	@$(BIN)/python -m bench.all

lint: install  ## the CI gates, in seconds: lint, format, strict types (shared, worker, scheduler)
	@$(BIN)/ruff check .
	@$(BIN)/ruff format --check .
	@$(BIN)/mypy --strict

typecheck: install
	@$(BIN)/mypy --strict

clean:
	rm -rf .treadle .pytest_cache .mypy_cache .ruff_cache
