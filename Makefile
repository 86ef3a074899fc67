PY ?= python

.PHONY: setup train export test lint bench docs

setup:
	bash .ci/setup.sh

train: setup  # a newcomer's first run: the fastest recipe (python train.py alone is the plain one)
	$(PY) train.py experiment=speedrun
	$(PY) export.py deploy=int8

test: setup
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) -m pytest -q

lint:
	$(PY) -m ruff check --fix .
	$(PY) -m ruff format .

bench:
	$(PY) -m bench

docs: setup
	$(PY) -m bench readme
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict
