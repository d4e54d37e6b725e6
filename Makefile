# Two commands on a fresh machine: `make demo` (installs, then a real tiny YOLO training in
# the TUI) and `make test`.  Both create the virtual environment themselves.
VENV   ?= .venv
PY      = $(VENV)/bin/python
STAMP   = $(VENV)/.installed

.PHONY: venv demo test bench clean

$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	# torch first, pinned: pip takes these files from the local disk (no CUDA download)
	$(VENV)/bin/pip install -q torch==2.14.1 torchvision==0.29.1
	$(VENV)/bin/pip install -q -e '.[train,test]'
	touch $(STAMP)

venv: $(STAMP)

demo: venv
	$(VENV)/bin/trainctl demo

test: venv
	$(VENV)/bin/pytest

bench: venv
	for b in bench/bench_*.py; do echo "== $$b"; $(PY) $$b || exit 1; done

clean:
	rm -rf $(VENV) build *.egg-info
