# streamd: make build | test | bench | fuzz | style | vet | ci | run
GO       ?= go
BIN      := bin/streamd
VERSION  ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo devel)
# The rest of the version information that `streamd version` and the
# metric streamd_build_info show, as promu sets it, but reproducible like
# the -trimpath builds below: the date is the last commit's (in UTC), not
# the build's, and the user a fixed name, so that two builds of one commit
# are the same binary. Outside a git checkout (a tarball) revision, branch
# and date stay empty, and the revision shows as "unknown".
REVISION   ?= $(shell git rev-parse HEAD 2>/dev/null)
BRANCH     ?= $(shell git rev-parse --abbrev-ref HEAD 2>/dev/null)
BUILD_DATE ?= $(shell TZ=UTC0 git log -1 --format=%cd --date=format-local:%Y%m%d-%H:%M:%S 2>/dev/null)
BUILD_USER ?= streamd
VERSION_PKG := github.com/prometheus/common/version
LDFLAGS  := -X $(VERSION_PKG).Version=$(VERSION) -X $(VERSION_PKG).Revision=$(REVISION) -X $(VERSION_PKG).Branch=$(BRANCH) \
	-X $(VERSION_PKG).BuildUser=$(BUILD_USER) -X $(VERSION_PKG).BuildDate=$(BUILD_DATE)
FUZZTIME ?= 10s
BENCHTIME ?= 1s

.PHONY: all build test test-e2e-race test-short bench torture fuzz style vet tidy-check ci run clean verify-unit install uninstall check-config deb deb-tool

all: build

build:
	@echo ">> building $(BIN)"
	$(GO) build -trimpath -ldflags "$(LDFLAGS)" -o $(BIN) ./cmd/streamd

# TESTP is how many packages' tests run at once: one more than the cores,
# as many packages spend their time waiting on timers, servers and
# processes, not on a core.
TESTP ?= $(shell echo $$(( $$(nproc 2>/dev/null || echo 1) + 1 )))

# A race-built test binary sleeps a second before it exits, for goroutines
# still running to report races; goleak fails the packages that leave any.
test:
	@echo ">> running tests (race detector on, $(TESTP) packages at once)"
	GORACE="atexit_sleep_ms=0 $$GORACE" $(GO) test -race -count=1 -p $(TESTP) ./...

# test-e2e-race runs the end-to-end tests again with the daemon they start
# built with the race detector too (make test runs it as a plain build: see
# STREAMD_E2E_RACE in cmd/streamd/e2e_test.go). CI runs both.
test-e2e-race:
	@echo ">> running the end-to-end tests with a race-built daemon"
	STREAMD_E2E_RACE=1 $(GO) test -race -count=1 ./cmd/streamd

test-short:
	@echo ">> running short tests"
	$(GO) test -race -short -count=1 ./...

# bench runs every benchmark BENCHCOUNT times and writes BENCHMARKS.md with
# the medians and each goal; the end-to-end benchmarks of the binary run a
# few whole runs each.
BENCHCOUNT ?= 5
bench:
	@echo ">> running benchmarks ($(BENCHCOUNT) runs each; the raw output goes to bench.out)"
	$(GO) test -run='^$$' -bench=. -benchmem -benchtime=$(BENCHTIME) -count=$(BENCHCOUNT) \
		$$($(GO) list ./... | grep -v -e /cmd/streamd -e /tools/) > bench.out
	$(GO) test -run='^$$' -bench=. -skip=NATS -benchmem -benchtime=2x -count=3 -timeout 30m ./cmd/streamd >> bench.out
	$(GO) test -run='^$$' -bench=NATS -benchtime=1x -count=3 -timeout 30m ./cmd/streamd >> bench.out
	$(GO) run ./tools/benchreport < bench.out > BENCHMARKS.md
	@echo ">> wrote BENCHMARKS.md"

# torture kills the daemon, race-built, with SIGKILL $(KILLS) times at random
# points while a producer appends and handlers mix every outcome, and
# $(POINT_KILLS) times at each failpoint (internal/failpoint: mid-append,
# mid-commit, mid-spool), then audits everything. It also kills a process
# committing positions in a tight loop $(KILLS) times in each of four lanes
# (offsets TestCrash), and checks every sidecar left.
KILLS ?= 100
POINT_KILLS ?= 5
torture:
	@echo ">> torture: $(KILLS) kills at random points, $(POINT_KILLS) at each failpoint"
	@out=$$(mktemp) && trap 'rm -f "$$out"' EXIT && \
	if STREAMD_E2E_RACE=1 STREAMD_TORTURE_KILLS=$(KILLS) STREAMD_TORTURE_POINT_KILLS=$(POINT_KILLS) \
		$(GO) test -race -count=1 -run '^TestCrashKill9$$' -v -timeout 30m ./cmd/streamd > "$$out" 2>&1; \
	then grep -E 'audit:|seed|^(ok|---)' "$$out"; else cat "$$out"; exit 1; fi
	@echo ">> torture: $(KILLS) kills of a committing process in each of 4 lanes"
	@out=$$(mktemp) && trap 'rm -f "$$out"' EXIT && \
	if STREAMD_TORTURE_KILLS=$(KILLS) $(GO) test -race -count=1 -run '^TestCrash$$' -v -timeout 30m ./offsets > "$$out" 2>&1; \
	then grep -E 'kills|seed|^(ok|---)' "$$out"; else cat "$$out"; exit 1; fi

# fuzz runs every Fuzz target for $(FUZZTIME), $(FUZZJOBS) targets at a time
# (tools/fuzz.sh). The long run, one hour per target, on 2 cores:
#   make fuzz FUZZTIME=1h FUZZJOBS=2
FUZZJOBS ?= 1
fuzz:
	@GO=$(GO) tools/fuzz.sh $(FUZZTIME) $(FUZZJOBS)

# style checks gofmt and runs staticcheck (fetched and built through the
# module proxy on first use: a tool, not a dependency of streamd).
STATICCHECK ?= honnef.co/go/tools/cmd/staticcheck@v0.8.2
style:
	@echo ">> checking gofmt"
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$out" ]; then echo "gofmt needed on:"; echo "$$out"; exit 1; fi
	@echo ">> staticcheck"
	$(GO) run $(STATICCHECK) ./...

vet:
	@echo ">> go vet"
	$(GO) vet ./...

tidy-check:
	@echo ">> go mod tidy -diff"
	$(GO) mod tidy -diff

ci: style vet tidy-check test check-config verify-unit

# run builds streamd, publishes demo records into var/demo.ss (once) and runs
# the daemon on configs/local.toml until Ctrl-C. The shell prints its PID and
# execs the daemon, which keeps it, for kill -HUP.
run: build
	@mkdir -p var
	@if [ ! -f var/demo.ss ]; then \
		echo ">> publishing demo records into var/demo.ss"; \
		printf '%s\n' '{"id":1,"item":"tea"}' '{"id":2,"item":"coffee"}' \
			| $(BIN) publish --file=var/demo.ss --key=orders --header=source=make-run; \
	fi
	@echo ">> running streamd on configs/local.toml as PID $$$$ (reload: kill -HUP $$$$; metrics on http://127.0.0.1:9464/metrics; Ctrl-C stops)"; \
	exec $(BIN) run --config.file=configs/local.toml

check-config: build
	@echo ">> checking the example configurations"
	$(BIN) check-config --no-files --config.file=configs/streamd.toml
	$(BIN) check-config --no-files --config.file=configs/local.toml
	$(BIN) check-config --config.file=configs/pipe.toml --mode=pipe

clean:
	rm -rf bin var

UNITDIR  ?= /etc/systemd/system
PREFIX   ?= /usr/local
# unit writes the systemd unit to stdout with the streamd it runs at $(1):
# the unit in deploy/systemd names /usr/local/bin/streamd, where make
# install puts it by default.
unit = sed 's|/usr/local/bin/streamd|$(1)|g' deploy/systemd/streamd.service

# verify-unit checks the systemd unit with its ExecStart pointed at the built
# binary: systemd-analyze verify must print nothing, and the offline
# security score must be at most 2.0. The sysusers file must create the user
# and its group membership in a scratch root.
verify-unit: build
	@echo ">> verifying deploy/systemd/streamd.service"
	@tmp=$$(mktemp -d) && trap 'rm -rf "$$tmp"' EXIT && \
	$(call unit,$(abspath $(BIN))) > "$$tmp/streamd.service" && \
	out=$$(systemd-analyze verify --man=no "$$tmp/streamd.service" 2>&1) && \
	if [ -n "$$out" ]; then echo "$$out"; exit 1; fi && \
	systemd-analyze security --offline=yes --threshold=20 "$$tmp/streamd.service" | tail -1 && \
	mkdir -p "$$tmp/root/etc" && systemd-sysusers --root="$$tmp/root" $(abspath deploy/systemd/streamd.sysusers) && \
	grep -q '^streamd:' "$$tmp/root/etc/passwd" && grep -q '^seastreamer:.*streamd' "$$tmp/root/etc/group"

# install puts the binary, its man page, its bash and zsh completions, the
# unit (running $(PREFIX)/bin/streamd), the sysusers file and the example
# configuration in place (run as root; README's Install section lists the
# steps after it). An existing streamd.toml is never overwritten: the
# example goes beside it as streamd.toml.dist. The configuration is
# root:streamd 0640, readable by the service; in a DESTDIR on a machine
# without the streamd group it stays root's, and install says so.
CONFDIR  ?= /etc/streamd
install: build
	@echo ">> installing streamd"
	install -D -m 0755 $(BIN) $(DESTDIR)$(PREFIX)/bin/streamd
	install -d $(DESTDIR)$(PREFIX)/share/man/man1 $(DESTDIR)$(PREFIX)/share/bash-completion/completions $(DESTDIR)$(PREFIX)/share/zsh/site-functions
	$(BIN) --help-man > $(DESTDIR)$(PREFIX)/share/man/man1/streamd.1
	$(BIN) --completion-script-bash > $(DESTDIR)$(PREFIX)/share/bash-completion/completions/streamd
	$(BIN) --completion-script-zsh > $(DESTDIR)$(PREFIX)/share/zsh/site-functions/_streamd
	install -d $(DESTDIR)$(UNITDIR)
	$(call unit,$(PREFIX)/bin/streamd) > $(DESTDIR)$(UNITDIR)/streamd.service
	chmod 0644 $(DESTDIR)$(UNITDIR)/streamd.service
	install -D -m 0644 deploy/systemd/streamd.sysusers $(DESTDIR)/usr/lib/sysusers.d/streamd.conf
	@conf=$(DESTDIR)$(CONFDIR)/streamd.toml; \
	if [ -e "$$conf" ]; then \
		conf="$$conf.dist"; \
		echo ">> $(DESTDIR)$(CONFDIR)/streamd.toml exists and is kept; the example is $$conf (compare them: diff -u $$conf $(DESTDIR)$(CONFDIR)/streamd.toml)"; \
	fi; \
	install -D -m 0640 configs/streamd.toml "$$conf" && \
	if getent group streamd >/dev/null; then \
		chgrp streamd "$$conf"; \
	else \
		echo ">> no group streamd on this machine: $$conf stays root:root 0640; after systemd-sysusers, run: chgrp streamd $(CONFDIR)/streamd.toml"; \
	fi

# uninstall removes what install put in place, with the same DESTDIR and
# PREFIX, but the configuration (and its .dist) and the state directory,
# which hold the operator's edits and the positions: it says where they
# stay. Stop and disable the service first. The sysusers file is the Debian
# package's too: not on a machine where the package is installed.
uninstall:
	@echo ">> removing streamd"
	rm -f $(DESTDIR)$(PREFIX)/bin/streamd $(DESTDIR)$(PREFIX)/share/man/man1/streamd.1 \
		$(DESTDIR)$(PREFIX)/share/bash-completion/completions/streamd $(DESTDIR)$(PREFIX)/share/zsh/site-functions/_streamd \
		$(DESTDIR)$(UNITDIR)/streamd.service $(DESTDIR)/usr/lib/sysusers.d/streamd.conf
	@echo ">> kept: $(DESTDIR)$(CONFDIR)/ (the configuration) and /var/lib/streamd (the state directory); remove them by hand to drop them, and run systemctl daemon-reload"

# deb builds bin/streamd_$(DEB_VERSION)_amd64.deb with nfpm (fetched and
# built through the module proxy on first use: a tool, not a dependency of
# streamd), from deploy/deb/nfpm.yaml: the binary in /usr/bin and the unit
# running it from there. The binary links to the C library (the user and
# group lookups through NSS), so the package depends on a libc6 at least as
# new as the newest symbol version it uses, read from it (GLIBC_MIN). The Debian version, with revision 1, is the tag
# without its v (v1.2.3: 1.2.3); commits after a tag sort after it and
# before the next (v1.2.3-4-gabc1234: 1.2.3+4.gabc1234), a pre-release
# before its release (v1.2.3-rc1: 1.2.3~rc1), a build of a modified tree
# after what it modifies (v1.2.3-dirty: 1.2.3+dirty); a version that is not a tag's
# (a commit hash, even one that starts with a digit) becomes 0~VERSION,
# which sorts before any release.
NFPM        ?= github.com/goreleaser/nfpm/v2/cmd/nfpm@v2.45.2
DEB_VERSION ?= $(shell echo '$(VERSION)' | sed -E '/^v?[0-9]+\.[0-9]+/!s/^/0~/; s/^v//; s/-dirty$$/+dirty/; s/-([0-9]+)-g([0-9a-f]+)/+\1.g\2/; s/-/~/g; s/$$/-1/')
deb:
	@echo ">> building bin/streamd_$(DEB_VERSION)_amd64.deb"
	rm -rf bin/deb bin/streamd_*_amd64.deb && mkdir -p bin/deb
	GOOS=linux GOARCH=amd64 $(GO) build -trimpath -buildmode=pie \
		-ldflags "$(LDFLAGS) -s -w -linkmode=external -extldflags '-Wl,-z,relro,-z,now'" -o bin/deb/streamd ./cmd/streamd
	$(call unit,/usr/bin/streamd) > bin/deb/streamd.service
	bin/deb/streamd --help-man | gzip -9n > bin/deb/streamd.1.gz
	bin/deb/streamd --completion-script-bash > bin/deb/streamd.bash
	bin/deb/streamd --completion-script-zsh > bin/deb/streamd.zsh
	printf -- '- semver: "%s"\n  date: %s\n  packager: streamd maintainers <streamd@users.noreply.github.com>\n  deb:\n    urgency: medium\n    distributions: [unstable]\n  changes:\n    - note: Built from %s.\n' \
		'$(DEB_VERSION)' "$$(date -u -d @$$(git log -1 --format=%ct 2>/dev/null || date +%s) +%Y-%m-%dT%H:%M:%SZ)" '$(VERSION)' > bin/deb/changelog.yml
	glibc=$$(objdump -T bin/deb/streamd | sed -n 's/.*GLIBC_\([0-9.]*\).*/\1/p' | sort -Vu | tail -1); \
	[ -n "$$glibc" ] || { echo "make deb: cannot tell which glibc bin/deb/streamd needs: objdump -T (binutils) found no GLIBC_ version" >&2; exit 1; }; \
	GLIBC_MIN=$$glibc DEB_VERSION='$(DEB_VERSION)' $(GO) run $(NFPM) package --config deploy/deb/nfpm.yaml --packager deb --target bin/

# deb-tool fetches and builds the package tool, so that a later make deb
# need not wait for it.
deb-tool:
	$(GO) run $(NFPM) --version >/dev/null
