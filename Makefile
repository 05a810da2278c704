# capsnet-serve developer commands. `make test` and `make serve` work on a fresh clone.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
DATA_DIR ?= ../shared/data/mnist
HOST ?= 127.0.0.1
PORT ?= 8000
# gRPC's port; empty: capsnet-serve takes PORT + 1 (8001 beside the default 8000). 0 turns gRPC off.
GRPC_PORT ?=
# Said once, when the commands are installed: they live in the venv, which nothing puts on PATH.
PATH_HINT = The capsnet-* commands are in $(BIN), not on PATH: run them as $(BIN)/capsnet-train ..., or after \
	'source $(BIN)/activate' (once per shell) as capsnet-train ...

.PHONY: test lint typecheck pytest serve serve-install dev-install benchmark docs image-smoke proto clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

# Full install (serving + training + dev tools); re-run when pyproject.toml changes.
$(VENV)/.dev-installed: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q -e '.[training,dev]'
	touch $@
	@echo "$(PATH_HINT)"

# Serving install only: no torch.
$(VENV)/.serve-installed: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q -e .
	touch $@
	@echo "$(PATH_HINT)"

dev-install: $(VENV)/.dev-installed

lint: $(VENV)/.dev-installed
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(VENV)/.dev-installed
	$(BIN)/mypy

pytest: $(VENV)/.dev-installed
	CAPSNET_DATA_DIR=$${CAPSNET_DATA_DIR:-$(DATA_DIR)} $(BIN)/python -m pytest $(PYTEST_ARGS)

test: lint typecheck pytest

serve: $(VENV)/.serve-installed
	$(BIN)/capsnet-serve --host $(HOST) --port $(PORT) $(if $(GRPC_PORT),--grpc-port $(GRPC_PORT))

benchmark: $(VENV)/.dev-installed
	$(BIN)/python -m training.benchmarks.speed

# The documentation site (mkdocs.yml, docs/): built offline and strictly into site/ (git-ignored); open site/index.html.
docs: $(VENV)/.dev-installed
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

# Release check of the container image (README, "Deploy"): builds the CPU image with docker or podman, runs it,
# checks it, removes it; the last line is `image capsnet-serve:cpu NNN MB`. Needs no virtual environment.
image-smoke:
	CAPSNET_DATA_DIR=$${CAPSNET_DATA_DIR:-$(DATA_DIR)} $(PYTHON) deploy/image_smoke.py $(IMAGE_SMOKE_ARGS)

# The gRPC messages of the Open Inference Protocol: compile the .proto into the descriptor the service loads.
proto: $(VENV)/.dev-installed
	$(BIN)/python -m grpc_tools.protoc -I service/grpc --descriptor_set_out=service/grpc/grpc_predict_v2.binpb \
		service/grpc/grpc_predict_v2.proto

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache site
