# The two commands a newcomer needs: `make demo` and `make test`. Both set up .venv first.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
# Re-installing only when the pins or the package metadata change keeps `make setup` to seconds.
STAMP  := $(VENV)/.installed
# The demo writes beside, not over, the committed results.
DEMO   := experiments/results/demo

.PHONY: setup demo test bench clean

setup: $(STAMP)

$(STAMP): requirements.lock pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q -r requirements.lock
	$(PY) -m pip install -q --no-deps --no-build-isolation -e .
	$(PY) -c "import collage, collage.backends, collage.patterns, tvm, torch, onnxruntime, openvino"
	touch $(STAMP)

demo: setup
	$(PY) -m experiments.bench --model squeezenet --out $(DEMO)/peers.json

# A pytest process per core, each taking whole files (their module fixtures built once); then,
# alone on the machine, the tests that compare wall-clock times (marked `timed`), which a
# neighbour's compiles would disturb. The second phase runs even when the first fails.
test: setup
	$(PY) -m pytest -n auto --dist loadfile -m "not timed"; first=$$?; \
	$(PY) -m pytest -m timed && exit $$first

bench: setup
	$(PY) -m experiments.bench --model resnet50 bert squeezenet

clean:
	rm -rf $(VENV) build *.egg-info
