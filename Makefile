# streamd: make build | test | bench | fuzz | style | vet | ci | run
GO       ?= go
BIN      := bin/streamd
VERSION  ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo devel)
LDFLAGS  := -X main.version=$(VERSION)
FUZZTIME ?= 10s
BENCHTIME ?= 1s

.PHONY: all build test test-short bench fuzz style vet tidy-check ci run clean

all: build

build:
	@echo ">> building $(BIN)"
	$(GO) build -trimpath -ldflags "$(LDFLAGS)" -o $(BIN) ./cmd/streamd

test:
	@echo ">> running tests (race detector on)"
	$(GO) test -race -count=1 ./...

test-short:
	@echo ">> running short tests"
	$(GO) test -race -short -count=1 ./...

bench:
	@echo ">> running benchmarks"
	$(GO) test -run='^$$' -bench=. -benchmem -benchtime=$(BENCHTIME) ./...

# fuzz runs every Fuzz target for $(FUZZTIME); a longer run: make fuzz FUZZTIME=1h
fuzz:
	@echo ">> fuzzing each target for $(FUZZTIME)"
	@set -e; for pkg in $$($(GO) list ./...); do \
		dir=$$($(GO) list -f '{{.Dir}}' $$pkg); \
		for t in $$(grep -ho '^func Fuzz[A-Za-z0-9_]*' $$dir/*_test.go 2>/dev/null | sed 's/^func //'); do \
			echo ">> $$pkg $$t"; \
			$(GO) test -run='^$$' -fuzz="^$$t$$" -fuzztime=$(FUZZTIME) $$pkg; \
		done; \
	done

style:
	@echo ">> checking gofmt"
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$out" ]; then echo "gofmt needed on:"; echo "$$out"; exit 1; fi

vet:
	@echo ">> go vet"
	$(GO) vet ./...

tidy-check:
	@echo ">> go mod tidy -diff"
	$(GO) mod tidy -diff

ci: style vet tidy-check test

# run builds streamd, publishes a few demo records into var/demo.ss and decodes them.
run: build
	@echo ">> publishing demo records into var/demo.ss"
	@mkdir -p var
	@printf '%s\n' '[orders] {"id":1,"item":"tea"}' '[orders] {"id":2,"item":"coffee"}' '[audit] login ok' \
		| $(BIN) publish --file=var/demo.ss --header=source=make-run
	@echo ">> decoding var/demo.ss"
	$(BIN) decode var/demo.ss

clean:
	rm -rf bin var
