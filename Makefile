# The few commands people type. CI (.ci/run) runs `make test`'s command, then lint and
# typecheck.
.PHONY: install test lint format typecheck demo

install:
	python3 -m venv .venv && . .venv/bin/activate && pip install -q -e '.[test]'

test:
	. .venv/bin/activate && python -m pytest

lint:
	. .venv/bin/activate && ruff check . && ruff format --check .

format:
	. .venv/bin/activate && ruff format . && ruff check --fix .

typecheck:
	. .venv/bin/activate && mypy

demo:
	. .venv/bin/activate && image-crawler demo
