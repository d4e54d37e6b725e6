# Two commands on a fresh machine: `make demo` (installs, then a real tiny YOLO training in
# the TUI) and `make test`.  Both create the virtual environment themselves.
VENV   ?= .venv
PY      = $(VENV)/bin/python
STAMP   = $(VENV)/.installed

.PHONY: venv demo test lint bench bench-docs clean

$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	# torch first, pinned: PyPI's Linux wheel brings its CUDA libraries (about 3.2 GB in the
	# venv, GPU or not); `pip install torch --index-url https://download.pytorch.org/whl/cpu` is the CPU-only one
	$(VENV)/bin/pip install -q torch==2.14.1 torchvision==0.29.1
	$(VENV)/bin/pip install -q -e '.[train,test]'
	touch $(STAMP)

venv: $(STAMP)

# `make demo EPOCHS=2` for a short one (default: a few minutes, long enough to try every key).
# The dashboard's own ending is no error: q (exit 0) and q after a run you stopped (130)
# end `make demo` quietly (a failed demo run, 1, is make's error); trainctl is not put on your PATH (README).
demo: venv
	@$(VENV)/bin/trainctl demo $(if $(EPOCHS),--epochs $(EPOCHS)); code=$$?; \
	echo; \
	echo "make demo: trainctl is $(VENV)/bin/trainctl: \`. $(VENV)/bin/activate\` puts it on this shell's PATH"; \
	echo "make demo: a shorter or longer demo: \`make demo EPOCHS=N\` (\`trainctl demo --epochs N\`)"; \
	case $$code in 0|130) ;; *) exit $$code ;; esac

# `make test`: the whole suite, in two tiers.  The pure tiers (tests/unit, tests/tui) on
# FAST_WORKERS processes; then the e2e tier (real trainings, tmux, sshd, Slurm) on E2E_WORKERS.
# The e2e tier is parallel-safe (short temp paths; the tests on the shared test Slurm keep to
# one worker: xdist_group "slurm", tests/e2e/conftest.py), but on 2 cores its real Ultralytics
# trainings slow each other past their limits, so it runs on one worker by default:
# `make test E2E_WORKERS=3` on a machine with more cores.  Fails when either tier fails.
# `make test-fast`: the pure tiers alone.
FAST_WORKERS ?= 2
E2E_WORKERS  ?= 1

test: venv
	@start=$$(date +%s); \
	$(VENV)/bin/pytest -n $(FAST_WORKERS) tests/unit tests/tui; fast=$$?; \
	mid=$$(date +%s); \
	$(VENV)/bin/pytest -n $(E2E_WORKERS) --dist loadgroup --durations=10 tests/e2e; e2e=$$?; \
	end=$$(date +%s); \
	echo "make test: pure tiers $$([ $$fast -eq 0 ] && echo passed || echo FAILED) in $$((mid - start)) s," \
	     "e2e tier $$([ $$e2e -eq 0 ] && echo passed || echo FAILED) in $$((end - mid)) s" \
	     "($$((end - start)) s in all, $(E2E_WORKERS) e2e workers)"; \
	[ $$fast -eq 0 ] && [ $$e2e -eq 0 ]

.PHONY: test-fast
test-fast: venv
	$(VENV)/bin/pytest -n $(FAST_WORKERS) tests/unit tests/tui

# ruff (lint, then format), mypy (src/ only: strict on trainctl.core), the import-linter layer
# contracts; the settings are in pyproject.toml, and .pre-commit-config.yaml runs the same.
LINT_PATHS = src tests bench examples
lint: venv
	$(VENV)/bin/ruff check $(LINT_PATHS)
	$(VENV)/bin/ruff format --check $(LINT_PATHS)
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports

bench: venv
	for b in bench/bench_*.py; do echo "== $$b"; $(PY) $$b || exit 1; done

# `make bench-docs`: every bench whose tables docs/benchmarks.md holds, one after another (they
# time real runs: never two at once), each writing its tables between its markers there
# (bench/doc_tables.py); `make bench-docs BENCH=ranks` for one (the names below).  An hour and
# more in all on 2 cores; each table records the load it ran at.
BENCH_DOCS_certain_stall     = bench/bench_certain_stall.py
BENCH_DOCS_detection_matrix  = bench/bench_detection_matrix.py
BENCH_DOCS_incidents_defaults = bench/bench_incidents.py --defaults
BENCH_DOCS_incidents         = bench/bench_incidents.py --cap 90 --yolo-cap 300
BENCH_DOCS_ranks             = bench/bench_ranks.py --cap 30
BENCH_DOCS_spare             = bench/bench_spare.py
BENCH_DOCS_serve             = bench/bench_serve.py --window 15
BENCH_DOCS_ladder            = bench/bench_ladder.py
BENCH_DOCS_preset_history    = bench/bench_preset_history.py
BENCH_DOCS_checkpoint_watch  = bench/bench_checkpoint_watch.py
BENCH_DOCS = certain_stall detection_matrix incidents_defaults incidents ranks spare serve \
             ladder preset_history checkpoint_watch
bench-docs: venv
	@$(foreach b,$(or $(BENCH),$(BENCH_DOCS)),\
	  $(if $(BENCH_DOCS_$(b)),,echo "make bench-docs: no bench named $(b) (one of: $(BENCH_DOCS))"; exit 2;) \
	  echo "== $(b): $(BENCH_DOCS_$(b))"; $(PY) $(BENCH_DOCS_$(b)) --docs || exit 1;)

clean:
	rm -rf $(VENV) build *.egg-info
