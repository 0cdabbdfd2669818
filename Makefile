# SPDX-License-Identifier: Apache-2.0
# strata — the two commands that set up a fresh machine:
#   make run    install missing Debian packages, build, train the default model
#   make test   install missing Debian packages, build, run the test suite (no GPU tests)
BUILD   ?= build
JOBS    ?= $(shell nproc)
CMAKE_FLAGS ?=
STRATA_RUN_ARGS ?=

.PHONY: all deps python-env configure build test test-gpu run clean

all: build

deps:
	@./scripts/install-deps.sh

# What the Python tests need beyond Debian's packages: a venv over the Python
# with torch and the wheels pip builds strata with (scripts/python-env.sh).
python-env: deps
	@./scripts/python-env.sh $(BUILD)

$(BUILD)/build.ninja:
	cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Release $(CMAKE_FLAGS)

configure: $(BUILD)/build.ninja

build: deps configure
	cmake --build $(BUILD) -j $(JOBS)

# Everything but the tests that need a GPU (label gpu).
test: build python-env
	ctest --test-dir $(BUILD) -LE gpu --output-on-failure -j $(JOBS)

# On a machine with a GPU: only the GPU tests.
test-gpu: build
	ctest --test-dir $(BUILD) -L gpu --output-on-failure

# The main job: train the default model (GPU if present, else the CPU backend).
run: build
	@$(BUILD)/bin/strata train $(STRATA_RUN_ARGS)

clean:
	rm -rf $(BUILD)
