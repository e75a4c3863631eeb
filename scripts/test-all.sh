#!/usr/bin/env bash
# Runs every nri-qos test on a fresh machine: lint, unit/property/protocol
# tests, the proto conformance test against Debian's containerd/nri, and the
# end-to-end tests with real containerd 1.7.24 and 2.1.9 and CRI-O 1.37 (from
# ../shared/tools/bin beside the repository) in a qemu VM.
# Installs what it needs itself. Set NRI_QOS_E2E=0 to skip the VM tests.
set -euo pipefail
cd "$(dirname "$0")/.."

. scripts/lib/toolchain.sh
step() { printf '\n=== %s ===\n' "$*"; }

step "upstream NRI protos (Debian golang-github-containerd-nri-dev)"
bash tests/upstream/fetch-nri-protos.sh

step "format and lint"
cargo fmt --check
cargo clippy --all-targets --locked -- -D warnings
# The build without the Kubernetes API client (cargo feature `kube`) must
# keep compiling: the product code only, ~1 min.
cargo clippy --lib --bins --locked --no-default-features -- -D warnings

# Supply chain (deny.toml): licenses, banned/duplicate crates, crates.io as the
# only source. cargo-deny is pinned (0.20.2 needs Rust >= 1.88) and built once
# per machine into a cache outside the checkout, then reused while the pin
# holds. The build takes 202 s of CPU: about 2-3.5 min wall on an idle 2-core
# machine (18.7 min measured on one shared with six other builds). The advisories check needs a host
# CI cannot reach (deny.toml says more).
CARGO_DENY_VERSION=0.20.2
TOOLS="${NRI_QOS_TOOLS:-${XDG_CACHE_HOME:-$HOME/.cache}/nri-qos/tools}"
step "supply chain (cargo-deny $CARGO_DENY_VERSION: licenses bans sources)"
if [ "$("$TOOLS/bin/cargo-deny" --version 2>/dev/null || true)" != "cargo-deny $CARGO_DENY_VERSION" ]; then
  cargo install --locked --root "$TOOLS" cargo-deny --version "$CARGO_DENY_VERSION"
fi
PATH="$TOOLS/bin:$PATH" cargo deny --locked check licenses bans sources

# API docs, private items included (the crate is read by the people who
# change it): every intra-doc link resolves and no doc comment is malformed.
# A public item's doc may link to a private one, which these docs contain.
step "docs (cargo doc, warnings denied)"
RUSTDOCFLAGS="-D warnings -A rustdoc::private-intra-doc-links" \
  cargo doc --no-deps --locked --document-private-items

# Dependencies a Cargo.toml names that no code uses. cargo-machete is pinned
# and cached like cargo-deny (its build: 153 s of CPU); it reads the sources,
# so it needs no build of ours.
CARGO_MACHETE_VERSION=0.9.2
step "unused dependencies (cargo-machete $CARGO_MACHETE_VERSION)"
if [ "$("$TOOLS/bin/cargo-machete" --version 2>/dev/null || true)" != "$CARGO_MACHETE_VERSION" ]; then
  cargo install --locked --root "$TOOLS" cargo-machete --version "$CARGO_MACHETE_VERSION"
fi
"$TOOLS/bin/cargo-machete"

export NRI_QOS_E2E="${NRI_QOS_E2E:-1}"
if [ "$NRI_QOS_E2E" = 1 ]; then
  # The VM tests use the debug binaries cargo test builds anyway: a release
  # build would add minutes to every run for no extra proof.
  step "VM prerequisites (qemu, kernel, containerd .debs)"
  bash tests/e2e/fetch.sh
fi

# The API source's integration test (tests/kube_api.rs) runs Debian's etcd and
# kubectl beside ../shared/tools/bin/kube-apiserver.xz.
step "API server prerequisites (etcd-server, kubectl .debs)"
bash tests/kube/fetch.sh

step "tests"
cargo test --locked -- --nocapture 2>&1 | tee target/test-all.log
# cargo test prints one 'test result' line per test binary; sum them for one closing line.
awk '/^test result:/ {p+=$4; f+=$6} END {printf "\ntotal: %d passed, %d failed\n", p, f}' target/test-all.log
# Tests whose tools are absent skip with a message (a fresh clone without
# ../shared/tools still passes); repeat those messages where nobody misses them.
if grep -qE 'SKIPPED|\] SKIP:|SKIP the' target/test-all.log; then
  echo "skipped (tools or opt-ins missing):"
  grep -E 'SKIPPED|\] SKIP:|SKIP the' target/test-all.log | sed 's/^[^A-Za-z[]*//' | sort -u | sed 's/^/  /'
fi
