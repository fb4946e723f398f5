# blockwire: `make demo` and `make test` work as root on a fresh Debian machine.
SHELL := /bin/bash
CARGO ?= cargo
BIN := target/release/blockwire
# Debian packages the tests, benchmarks and demo use (peers, clients, the kernel VM, the report check).
DEB_PACKAGES := fuse3 xfsprogs tgt vblade libiscsi-bin qemu-utils qemu-block-extra qemu-system-x86 fio tshark \
	iperf3 iproute2 e2fsprogs busybox-static kmod cpio open-iscsi chromium ethtool procps jq \
	ceph-mon ceph-osd ceph-common librbd-dev postmark bonnie++
# Seconds each fuzz target runs under `make fuzz`.
FUZZ_SECONDS ?= 60

.PHONY: all deps build test demo fuzz bench clean

all: build

# Two passes: installing one package can remove another that was there
# (Debian's qemu-block-extra replaces a backported qemu-utils), so check again.
deps:
	@for pass in 1 2; do \
		missing=$$(for p in $(DEB_PACKAGES); do dpkg-query -W -f='$${Status}\n' $$p 2>/dev/null | grep -q '^install ok installed' || echo $$p; done); \
		[ -z "$$missing" ] && break; \
		echo "installing Debian packages:" $$missing; \
		{ [ $$pass = 2 ] || apt-get update -qq; } && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null || exit 1; \
	done
	@command -v $(CARGO) >/dev/null || { echo "cargo (Rust stable) is required: see https://rustup.rs" >&2; exit 1; }

build: deps
	$(CARGO) build --release --workspace

# Every test: unit, property and byte-vector tests, then the integration tests
# (namespaces, peers, tshark, the kernel VM, the lab report in Chromium).
test: build
	@mkdir -p target
	@set -o pipefail; $(CARGO) test --release --workspace --no-fail-fast 2>&1 | tee target/test.log; rc=$$?; \
	awk '/^test result:/ { p += $$4; f += $$6; s += $$8 } END { printf "tests: %d passed, %d failed, %d skipped\n", p, f, s }' target/test.log; \
	exit $$rc

# Every suite on a RAM disk with small sizes (under 5 minutes on a quiet
# 2-core machine); the report path is printed at the end.
demo: build
	$(BIN) lab --quick

bench: build
	@for b in bench/*; do [ -x "$$b" ] && { echo "== $$b"; "$$b"; }; done

# Coverage-guided fuzzing of every parser (needs cargo-fuzz; the seed corpora
# also run as ordinary tests in `make test`).
fuzz: deps
	@command -v cargo-fuzz >/dev/null || $(CARGO) install cargo-fuzz --locked
	@for d in crates/*/fuzz; do \
		for t in $$(cd $$d && RUSTC_BOOTSTRAP=1 cargo fuzz list); do \
			echo "== fuzz $$d $$t ($(FUZZ_SECONDS) s)"; \
			(cd $$d && RUSTC_BOOTSTRAP=1 cargo fuzz run $$t -- -max_total_time=$(FUZZ_SECONDS)) || exit 1; \
		done; \
	done

clean:
	$(CARGO) clean
