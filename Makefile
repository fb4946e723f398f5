# blockwire: `make demo` and `make test` work as root on a fresh Debian machine.
SHELL := /bin/bash
CARGO ?= cargo
BIN := target/release/blockwire
# Debian packages the tests, benchmarks and demo use (peers, clients, the kernel VM, the report check;
# clang, libbpf-dev and linux-libc-dev build the router's BPF datapath, bpftool checks it is gone after tests;
# libibverbs-dev and librdmacm-dev build crates/rdma, ibverbs-providers is soft-RoCE's provider in the kernel VM;
# stress-ng is the CPU hog the lab's ending tests are run beside to show they hold on a busy machine).
DEB_PACKAGES := fuse3 xfsprogs btrfs-progs eatmydata tgt tgt-rbd vblade libiscsi-bin qemu-utils qemu-block-extra qemu-system-x86 fio tshark \
	iperf3 iproute2 e2fsprogs busybox-static openssh-server kmod cpio open-iscsi chromium ethtool procps jq \
	ceph-mon ceph-osd ceph-common librbd-dev postmark bonnie++ clang libbpf-dev linux-libc-dev bpftool \
	prometheus systemd man-db dpkg-dev lintian nfs-ganesha nfs-ganesha-vfs rpcbind libibverbs-dev librdmacm-dev ibverbs-providers python3-venv \
	gawk bsdextrautils stress-ng libssl-dev pkg-config socat
# Seconds each fuzz target runs under `make fuzz`; FUZZ_RUNS=N runs N
# executions per target instead (the campaign in docs/reliability.md used 10000000).
FUZZ_SECONDS ?= 60
FUZZ_RUNS ?=
# The long versions of the durability, load and socket-fuzz tests (`make soak`).
# 3,000 idle sockets: each connection costs the target five descriptors (its
# own thread's tokio runtime), and 4,000 hit a hard limit of 20,000 where the
# target may not raise it (no CAP_SYS_RESOURCE, as in this container).
SOAK_ENV := DURABILITY_CYCLES=20 LOAD_SESSIONS=512 LOAD_LOGIN_CYCLES=50000 LOAD_BURST_CYCLES=20000 LOAD_IDLE_SOCKETS=3000 SOCKET_FUZZ_SECONDS=1800
# The RustSec advisory database `make audit` checks Cargo.lock against: the
# offline snapshot at ADVISORY_DB when there is one (CI keeps one beside the
# repository); otherwise the live database, which cargo-audit fetches into
# target/advisory-db. The pinned cargo-audit is built once into ~/.cargo/bin
# (about 12 CPU-minutes): Debian 12 has no package of it.
ADVISORY_DB ?= $(CURDIR)/../shared/advisory-db
LIVE_ADVISORY_DB := $(CURDIR)/target/advisory-db
CARGO_AUDIT_VERSION := 0.22.2
# kubernetes-csi/csi-test's csi-sanity, built against CSI 1.13.0 (the csi.proto crates/csi vendors).
CSI_SANITY_VERSION := v5.6.0
# `make install`: where (DESTDIR stages a tree for packaging).
PREFIX ?= /usr/local
DESTDIR ?=

.PHONY: all deps build audit test soak demo fuzz bench clean install deb

all: build

# Packages install without starting their services (policy-rc.d says no while
# apt runs): the tests start sshd, tgtd, Prometheus and the NFS server
# themselves, in namespaces, and a test machine should not gain listeners.
# Two passes: installing one package can remove another that was there
# (Debian's qemu-block-extra replaces a backported qemu-utils), so check again.
deps:
	@for pass in 1 2; do \
		missing=$$(for p in $(DEB_PACKAGES); do dpkg-query -W -f='$${Status}\n' $$p 2>/dev/null | grep -q '^install ok installed' || echo $$p; done); \
		[ -z "$$missing" ] && break; \
		echo "installing Debian packages:" $$missing; \
		guard=; [ -e /usr/sbin/policy-rc.d ] || { printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d && chmod 755 /usr/sbin/policy-rc.d && guard=1; }; \
		{ [ $$pass = 2 ] || apt-get update -qq; } && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
		status=$$?; [ -z "$$guard" ] || rm -f /usr/sbin/policy-rc.d; [ $$status = 0 ] || exit 1; \
	done
	@command -v $(CARGO) >/dev/null || { echo "cargo (Rust stable) is required: see https://rustup.rs" >&2; exit 1; }
	@# csi-sanity (the CSI conformance suite) where Go and its module proxy are reachable;
	@# without it the CSI test says "skipped: no csi-sanity" and counts as skipped.
	@if ! command -v csi-sanity >/dev/null && [ ! -x "$$(go env GOPATH 2>/dev/null)/bin/csi-sanity" ]; then \
		if command -v go >/dev/null; then \
			echo "installing csi-sanity $(CSI_SANITY_VERSION) with go install"; \
			timeout 600 go install github.com/kubernetes-csi/csi-test/v5/cmd/csi-sanity@$(CSI_SANITY_VERSION) || echo "csi-sanity: go install failed: the CSI test will be skipped"; \
		else echo "csi-sanity: no Go toolchain: the CSI test will be skipped"; fi; \
	fi

build: deps
	$(CARGO) build --release --workspace
	@# The examples (bench/ runs some) are built too, so that none rots unseen.
	$(CARGO) build --release --workspace --examples

# Known vulnerabilities and unsound code in Cargo.lock's crates fail;
# unmaintained crates are listed as warnings (.cargo/audit.toml). With no
# snapshot and no way to fetch (offline), the audit says so in one line,
# leaves target/audit.skipped for `make test`'s summary, and does not fail.
audit:
	@mkdir -p target; rm -f target/audit.skipped
	@$(CARGO) audit --version >/dev/null 2>&1 || $(CARGO) install --locked --version $(CARGO_AUDIT_VERSION) cargo-audit
	@if [ -d "$(ADVISORY_DB)/crates" ]; then \
		echo "audit: Cargo.lock against the RustSec snapshot in $(ADVISORY_DB) ($$(grep -o 'commit [0-9a-f]*, [0-9-]*' "$(ADVISORY_DB)/README.md" 2>/dev/null || echo 'undated'))"; \
		$(CARGO) audit --db "$(ADVISORY_DB)" --no-fetch --file Cargo.lock && echo "audit: no vulnerable or unsound crates"; \
	else \
		echo "audit: no snapshot at $(ADVISORY_DB); fetching the live RustSec database into $(LIVE_ADVISORY_DB)"; \
		timeout 300 $(CARGO) audit --db "$(LIVE_ADVISORY_DB)" --file Cargo.lock 2>target/audit.err; rc=$$?; \
		if [ -d "$(LIVE_ADVISORY_DB)/crates" ]; then \
			cat target/audit.err >&2; [ $$rc = 0 ] && echo "audit: no vulnerable or unsound crates"; exit $$rc; \
		fi; \
		why=$$(grep -v '^ *$$' target/audit.err | tail -1 | sed 's/^[ ->]*//' | cut -c1-160); \
		echo "no advisory database (no snapshot at $(ADVISORY_DB), and fetching failed: $${why:-exit $$rc})" >target/audit.skipped; \
		echo "audit: NOT RUN: $$(cat target/audit.skipped)"; \
	fi

# Every test: the dependency audit, unit, property and byte-vector tests,
# then the integration tests (namespaces, peers, tshark, the kernel VM, the
# lab report in Chromium). --tests: no crate has doc tests, and their
# twenty empty blocks would push the failures out of the tail CI shows;
# for the same reason each failed test's panic message is repeated last.
# A test whose peer is missing counts as skipped, not passed, and is listed
# with its reason (common::skip in crates/cli/tests/integration, target/skipped).
test: build audit
	@mkdir -p target; rm -rf target/skipped
	@set -o pipefail; BW_SKIPPED_DIR=$(CURDIR)/target/skipped $(CARGO) test --release --workspace --no-fail-fast --tests 2>&1 | tee target/test.log; rc=$$?; \
	[ $$rc -eq 0 ] || awk '/^---- .* stdout ----$$/ { name = $$2 } \
		/panicked at/ && name != "" { print "FAILED " name ": " $$0; n = 12 } \
		n > 0 && !/panicked at/ { if ($$0 == "" || /^note: /) n = 0; else { print "  " $$0; n-- } }' target/test.log; \
	[ ! -f target/audit.skipped ] || echo "audit: NOT RUN: $$(cat target/audit.skipped)"; \
	tests/test-summary target/test.log target/skipped "$$([ -f target/audit.skipped ] && echo ' (the dependency audit did not run)')"; \
	exit $$rc

# Faults, load and hostile input for longer (under 2 hours on 2 cores): 20
# SIGKILL cycles per protocol, 512 mixed sessions, 50,000 login cycles,
# 3,000 idle sockets, 30 minutes of socket fuzzing each for iSCSI, NVMe/TCP
# and the control methods over HTTP (the three run side by side). `make
# test` runs the short versions.
# --nocapture: the summary lines below come from passing tests; the targets'
# own log lines ([serve]) go only to target/soak.log.
soak: build
	@mkdir -p target
	@set -o pipefail; $(SOAK_ENV) $(CARGO) test --release -p blockwire --test integration -- --nocapture \
		durability:: load:: socket_fuzz:: 2>&1 | tee target/soak.log | grep -v '^\[serve\] '; rc=$$?; \
	grep -E '^(DURABILITY|LOAD|SOCKET FUZZ) ' target/soak.log; \
	awk '/^test result:/ { p += $$4; f += $$6 } END { printf "soak: %d passed, %d failed\n", p, f }' target/soak.log; \
	exit $$rc

# Every suite on a RAM disk with small sizes (under 5 minutes on a quiet
# 2-core machine); the report path is printed at the end.
demo: build
	$(BIN) lab --quick

bench: build
	@for b in bench/*; do [ -x "$$b" ] && { echo "== $$b"; "$$b"; }; done

# Coverage-guided fuzzing of every parser, one target at a time (needs
# cargo-fuzz, installed if missing); writes target/fuzz-campaign.md.
fuzz: deps
	FUZZ_SECONDS=$(FUZZ_SECONDS) FUZZ_RUNS=$(FUZZ_RUNS) tests/fuzz-campaign

# The binary, systemd unit, man pages, shell completions and example config
# under $(DESTDIR)$(PREFIX) (docs/install.md). Builds only the binary, with
# the `dist` profile (Cargo.toml says why) (NO_BUILD=1: install $(BIN) as
# it is, as the tests do from inside cargo).
DIST_BIN := target/dist/blockwire
SHIP_BIN = $(if $(NO_BUILD),$(BIN),$(DIST_BIN))
install:
	@[ -n "$(NO_BUILD)" ] || $(CARGO) build --profile dist -p blockwire
	packaging/install $(SHIP_BIN) "$(DESTDIR)" "$(PREFIX)"

# A Debian package of the same files under /usr, in $(DEB_DIR).
DEB_DIR ?= target/deb
deb:
	@[ -n "$(NO_BUILD)" ] || $(CARGO) build --profile dist -p blockwire
	packaging/build-deb $(SHIP_BIN) $(DEB_DIR)

clean:
	$(CARGO) clean
