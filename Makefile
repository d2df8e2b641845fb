# pdx tasks. A fresh machine needs only the first two.
.PHONY: demo test e2e setup native lint crd golden chart bench-router bench-operator local images fuzz

demo: setup            ## local topology (vLLM CPU + NIXL + router), TTFT off vs on, plots in out/
	.venv/bin/pdx bench --local --out out/demo

test:                  ## set up, lint, type-check, run all tests (CI runs this)
	scripts/test.sh

setup:                 ## .venv with pdx, vLLM CPU, NIXL and the test tools
	scripts/setup.sh

native:                ## compile the router's data path (mypyc) after an edit; setup and test do it too
	.venv/bin/python scripts/build_router_native.py

fuzz:                  ## the long fuzz run, outside CI: a million inputs a target (docs/fuzzing.md)
	.venv/bin/python scripts/fuzz.py --coverage

e2e:                   ## only the end-to-end tests with real vLLM CPU engines (make test runs them too)
	.venv/bin/pytest -q -p no:cacheprovider -m engines tests/e2e

images:                ## the operator and router images, with buildah on a base from Debian's packages
	scripts/build-images.sh

lint:                  ## ruff + mypy --strict
	.venv/bin/ruff check . && .venv/bin/mypy

crd:                   ## regenerate crds/ and the chart's copies from the models
	.venv/bin/pdx crd --write && .venv/bin/python scripts/sync_chart.py

golden:                ## regenerate tests/golden after an intended rendering change
	UPDATE_GOLDEN=1 .venv/bin/pytest -q tests/render/test_cli_and_golden.py

local:                 ## run the embedded local topology until Ctrl-C
	.venv/bin/pdx local up

bench-router:          ## router CPU and added TTFT beside direct, vllm-router, smg and vLLM's example proxy
	.venv/bin/python scripts/bench_router.py

bench-operator:        ## reconcile latency and 500 resources against kmock
	.venv/bin/python scripts/bench_operator.py
