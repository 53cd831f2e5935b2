# Two commands on a fresh machine: `make run` and `make test`.
VENV := .venv
PY := $(VENV)/bin/python
SHELL := /bin/bash

.PHONY: setup setup-runtime run model test fuzz check proto proto-check bench bench-smoke \
        bench-train profile soak clean

setup:           ## dev environment: runtime + tests, lint, proto tools (idempotent)
	@scripts/setup.sh dev
	@scripts/setup_node.sh

setup-runtime:   ## runtime environment only
	@scripts/setup.sh runtime

model: setup-runtime  ## train the embedded default model if models/ has none
	@$(PY) -m training.default_model --model-repository models

run: model       ## serve models/ on 127.0.0.1: gRPC :50051, HTTP :8000 (REST, the page), metrics :9464
	@scripts/serve.sh --model-repository models --host 127.0.0.1 --grpc-port 50051 --metrics-port 9464

test: setup      ## test tools (promtool, chromium, k8s validators; no network once there), then the whole suite
	@scripts/install_promtool.sh
	@scripts/install_chromium.sh
	@scripts/install_k8s_tools.sh >/dev/null
	@$(PY) -m pytest -q

.PHONY: image-test
image-test: setup  ## build the images from a clean clone (Docker), run the CPU one as docs/deploy.md says
	@scripts/image_test.sh

fuzz: setup      ## the server fuzz tests at length, the OIP REST spec's included (CI runs a short, fixed profile)
	@HYPOTHESIS_PROFILE=long $(PY) -m pytest -q --timeout=0 tests/service/rpc/test_fuzz.py \
		tests/service/rpc/http/test_fuzz.py tests/service/rpc/http/test_spec.py

check: setup proto-check  ## ruff + mypy
	@$(VENV)/bin/ruff check .
	@$(VENV)/bin/mypy

proto: setup     ## regenerate genproto from proto/
	@$(PY) scripts/gen_proto.py

proto-check: setup
	@$(PY) scripts/gen_proto.py --check

bench: setup     ## the suites: serving, scaling, overload, memory, profile; one target block (bench/results/)
	@$(PY) -m bench

profile: setup   ## where a T=16 request's server CPU goes, by stage, per wire (py-spy; bench/results/)
	@$(PY) -m bench --suites profile

bench-smoke: setup  ## every path of every suite once, at tiny sizes (bench/results/quick/)
	@$(PY) -m bench --quick --out bench/results/quick

bench-train: setup  ## training throughput and MFU of the default run (bench/results/train_bench.json)
	@$(PY) -m training.bench

soak: setup      ## 4 clients, 3 min against 2 workers: reloads, a kill, slow readers (bench/results/soak.*)
	@$(PY) -m bench.soak

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
