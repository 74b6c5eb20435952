# The project's two commands are in README.md; `make test` is the second.
PY ?= python

.PHONY: install test test-go test-py lint

install:
	$(PY) -m pip install -e '.[test]'

test: lint test-go test-py

lint:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed: $$out"; exit 1; fi
	go vet ./...
	$(PY) -m ruff check pyfastensor tests setup.py

test-go:
	go test -race -count=1 ./...

test-py:
	$(PY) -m pytest -q
