# All set-up happens here: a fresh machine needs only python3 (>= 3.11) and,
# for the Spark pipeline, Java 17.
PY      ?= python3
VENV    ?= .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed

.PHONY: demo demo-cluster test lint bench soak clean

# `make soak MINUTES=30`: how long the fault loops run.
MINUTES ?= 10

# Re-installing also rebuilds the native core (message/_native.c, journal/_native.c),
# optional C extensions.
$(STAMP): pyproject.toml setup.py message/_native.c $(wildcard message/_native_src/*.c) journal/_native.c
	@echo "Setting up $(VENV): installing PySpark, pyarrow and the other dependencies."
	@echo "The first time, this downloads about 400 MB: a minute or more. Progress below."
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install -e '.[spark,test,postgres,metrics]'
	@echo "$(VENV) is ready."
	touch $(STAMP)

demo: $(STAMP)            ## run the demo pipeline on the embedded journal store
	$(BIN)/exactly demo

demo-cluster: $(STAMP)    ## the same demo on local Gazette and Spark clusters (needs Go)
	$(BIN)/exactly demo --cluster

# The tests that touch message, framing and journal, run a second time on
# the Python implementation (EXACTLY_PURE_PYTHON=1): Spark's and the Gazette
# cluster's own tests run once.
PURE_TESTS ?= -m "not spark and not slow and not gazette" --ignore=tests/exactly/test_localcluster.py

test: $(STAMP)            ## run the whole test suite, on the native core then on the Python implementation
	$(BIN)/ruff check .
	$(BIN)/mypy
	# pytest exits 5 when it collects no test: that alone is not a failure.
	$(BIN)/python -m pytest $(PYTEST_ARGS) || [ $$? -eq 5 ]
	EXACTLY_PURE_PYTHON=1 $(BIN)/python -m pytest $(PURE_TESTS) $(PYTEST_ARGS) || [ $$? -eq 5 ]

bench: $(STAMP)           ## run every benchmark and print a table
	$(BIN)/exactly bench

soak: $(STAMP)            ## SIGKILL writers and consumers at random for MINUTES minutes (not in CI)
	$(BIN)/python -m tests.soak --minutes $(MINUTES)

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .hypothesis message/*.so journal/*.so
