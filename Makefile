# One-command set-up: `make demo` and `make test` install into .venv first when needed.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
PYTEST_ARGS ?=

.PHONY: install demo demo-video demo-wan test test-gpu gpu-report clean distclean

install: $(STAMP)

# Re-runs only when the requirement files or the package metadata change, so a second
# `make install` takes seconds.
$(STAMP): requirements.txt requirements-colossalai.txt pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check -r requirements.txt
	$(PY) -m pip install -q --disable-pip-version-check --no-deps -r requirements-colossalai.txt
	$(PY) -m pip install -q --disable-pip-version-check --no-deps -e .
	$(PY) -c "import colossalai.booster, opendit_lite" 2>/dev/null
	touch $(STAMP)

# Re-runnable: auto_resume continues the run from its newest checkpoint (or says there is nothing left
# to train and only samples again); a first run says it starts from step 0.
demo: $(STAMP)
	$(PY) train.py --config configs/demo.yaml auto_resume=true
	$(PY) sample.py --config configs/demo.yaml

# Text-to-video: a tiny STDiT on generated captioned clips; MP4s and a contact sheet under outputs/.
demo-video: $(STAMP)
	$(PY) train_video.py --config configs/video_stdit_demo.yaml auto_resume=true
	$(PY) sample_video.py --config configs/video_stdit_demo.yaml

# A tiny random-init diffusers WanTransformer3DModel on the same moving shapes.
demo-wan: $(STAMP)
	$(PY) train_video.py --config configs/wan_tiny_demo.yaml auto_resume=true
	$(PY) sample_video.py --config configs/wan_tiny_demo.yaml

# The layers contract (pyproject.toml, docs/architecture.md), lint and import order, then the suite
# on two workers (one per core; PYTEST_ARGS="-n 0" for one process), with the 10 slowest tests.
test: $(STAMP)
	$(VENV)/bin/lint-imports
	$(VENV)/bin/ruff check .
	$(PY) -m pytest -q -n 2 --dist worksteal --durations=10 $(PYTEST_ARGS)

test-gpu: $(STAMP)
	$(PY) -m pytest -q -m gpu $(PYTEST_ARGS)

# On the offline GPU machine (docs/gpu.md), without `make install`: the wheels of .whl/ (built by
# scripts/gpu_bundle.sh where the registries are) installed offline into $(GPU_SITE), then every GPU
# test and headline figure within --budget seconds, written to $OUT (else benchmarks/results/) as
# measured. Stops at once, before installing anything, where no CUDA GPU is visible.
GPU_SITE ?= /tmp/site
GPU_REPORT_ARGS ?= --budget 480
gpu-report:
	@$(PYTHON) -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 2)" 2>/dev/null || { \
	  echo "make gpu-report: no CUDA GPU is visible to $(PYTHON) (torch does not import, or torch.cuda.is_available()" \
	       "is False). It runs on the GPU machine (docs/gpu.md); here, python benchmarks/gpu_report.py --dry-run" \
	       "runs every section at toy sizes on the CPU." >&2; exit 2; }
	@ls .whl/*.whl >/dev/null 2>&1 || { echo "make gpu-report: no wheels in .whl/: run bash scripts/gpu_bundle.sh" \
	  "on a machine with the package registries and carry .whl/ to this one (docs/gpu.md)." >&2; exit 2; }
	$(PYTHON) -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target $(GPU_SITE) .whl/*.whl
	PYTHONPATH=$(GPU_SITE):$(CURDIR) PYTHONUNBUFFERED=1 $(PYTHON) benchmarks/gpu_report.py $(if $(OUT),--out $(OUT)) \
	  $(GPU_REPORT_ARGS)

# `make clean` removes what runs and tests wrote and keeps the installed .venv; `make distclean`
# removes .venv too.
clean:
	rm -rf outputs .pytest_cache

distclean: clean
	rm -rf $(VENV)
