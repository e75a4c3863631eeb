#!/usr/bin/env bash
# Builds benches/go-stub (a Go NRI plugin on containerd/nri's stub) offline,
# for `cargo bench --bench nri_roundtrip`, which runs it beside nri-qos.
#
# Everything comes from Debian, fetched through a PRIVATE apt configuration
# (the machine's own sources and lists stay untouched) and unpacked, not
# installed, under target/go-stub/: Go (the version golang-go points to) and
# golang-github-containerd-nri-dev 0.8.0 with the -dev packages it needs to
# compile. The build runs in GOPATH mode off the unpacked /usr/share/gocode,
# with no module proxy and no network.
#
# Output: target/go-stub/go-stub (stripped). Rerunning reuses the download.
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
out="${GO_STUB_DIR:-$here/../../target/go-stub}"
mkdir -p "$out"
out="$(cd "$out" && pwd)"
apt="$out/apt"
root="$out/root"
# Suites tried in order: the first whose golang-github-containerd-nri-dev is
# 0.8.0 (containerd 2.0/2.1's NRI) is used for every package.
suites=(forky sid)
nri_version=0.8.0
# What the stub (pkg/stub, pkg/api, pkg/net, ttrpc, grpc status) imports, found by
# building until nothing was missing; testify/gomega and friends are test-only.
dev_packages=(
  golang-github-containerd-nri-dev
  golang-github-containerd-ttrpc-dev
  golang-github-containerd-log-dev
  golang-github-sirupsen-logrus-dev
  golang-github-opencontainers-specs-dev
  golang-github-kubernetes-cri-api-dev
  golang-github-gogo-protobuf-dev
  golang-github-golang-protobuf-1-5-dev
  golang-google-protobuf-dev
  golang-google-genproto-dev
  golang-google-grpc-dev
  golang-golang-x-sys-dev
  golang-golang-x-net-dev
  golang-golang-x-text-dev
)

log() { echo "go-stub: $*" >&2; }

mirror="$(grep -hE '^(URIs:|deb )' /etc/apt/sources.list /etc/apt/sources.list.d/*.sources 2>/dev/null |
  grep -oE 'https?://[^ ]+/debian/?' | grep -v security | head -n1 || true)"
mirror="${mirror%/}"
[ -n "$mirror" ] || mirror="http://deb.debian.org/debian"

apt_opts=(
  -o "Dir::Etc::SourceList=$apt/sources.list" -o "Dir::Etc::SourceParts=/dev/null"
  -o "Dir::State::Lists=$apt/lists" -o "Dir::Cache=$apt/cache"
  -o "Dir::State::Status=/var/lib/dpkg/status" -o "APT::Get::List-Cleanup=0"
  -o "Debug::NoLocking=1" -o "APT::Sandbox::User=root" -o "Acquire::Languages=none"
)

# Private lists for one suite, refreshed at most once a day.
use_suite() {
  mkdir -p "$apt/lists/partial" "$apt/cache/archives/partial" "$apt/debs"
  local line="deb [arch=amd64 signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $mirror $1 main"
  if [ "$(cat "$apt/sources.list" 2>/dev/null)" != "$line" ]; then
    echo "$line" >"$apt/sources.list"
    rm -f "$apt/lists/"*Packages* "$apt/lists/"*Release*
  fi
  if [ -z "$(find "$apt/lists" -name '*Packages*' -mtime -1 2>/dev/null | head -1)" ]; then
    log "updating private apt lists ($1 from $mirror)"
    apt-get "${apt_opts[@]}" update -qq
  fi
}

candidate() { apt-cache "${apt_opts[@]}" policy "$1" | awk '/Candidate:/ {print $2}'; }

fetch() {
  local suite
  for suite in "${suites[@]}"; do
    use_suite "$suite"
    [[ "$(candidate golang-github-containerd-nri-dev)" == "$nri_version"-* ]] && break
    log "$suite has golang-github-containerd-nri-dev $(candidate golang-github-containerd-nri-dev), not $nri_version"
  done
  # golang-go is a metapackage: take the versioned toolchain it points to.
  local go_pkg
  go_pkg="$(apt-cache "${apt_opts[@]}" depends golang-go | awk '/Depends: golang-1\.[0-9]+-go$/ {print $2; exit}')"
  [ -n "$go_pkg" ] || { log "cannot resolve golang-go's toolchain package"; exit 1; }
  local pkgs=("$go_pkg" "${go_pkg%-go}-src" "${dev_packages[@]}")
  log "downloading ${pkgs[*]}"
  rm -f "$apt/debs/"*.deb
  (cd "$apt/debs" && apt-get "${apt_opts[@]}" download -qq "${pkgs[@]}")
  rm -rf "$root.tmp"
  local deb
  for deb in "$apt/debs/"*.deb; do dpkg-deb -x "$deb" "$root.tmp"; done
  rm -rf "$root" && mv "$root.tmp" "$root"
  (cd "$apt/debs" && ls) >"$out/packages.txt"
}

ls "$root"/usr/lib/go-*/bin/go >/dev/null 2>&1 || fetch
goroot="$(ls -d "$root"/usr/lib/go-1.* | sort -V | tail -1)"

log "building with $("$goroot/bin/go" version | cut -d' ' -f3) and $(grep -o 'golang-github-containerd-nri-dev_[^_]*' "$out/packages.txt")"
cd "$here"
env -u GOFLAGS GOROOT="$goroot" GOPATH="$root/usr/share/gocode" GO111MODULE=off GOPROXY=off \
  GOTOOLCHAIN=local GOCACHE="$out/cache" GOTELEMETRY=off CGO_ENABLED=0 \
  "$goroot/bin/go" build -trimpath -ldflags=-s -o "$out/go-stub" .
log "built $out/go-stub ($(stat -c %s "$out/go-stub") bytes)"
