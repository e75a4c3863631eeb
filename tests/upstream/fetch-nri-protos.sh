#!/usr/bin/env bash
# Fetches containerd/nri's api.proto as Debian ships it (golang-github-containerd-nri-dev:
# 0.6.1 in trixie, 0.8.0 in forky/sid) for the proto conformance test.
# Uses a private apt configuration so the machine's own apt sources stay untouched.
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
cache="$here/cache"
mkdir -p "$cache"

# The machine's own Debian mirror (first non-security URI that is not commented out).
mirror="$(grep -hE '^(URIs:|deb )' /etc/apt/sources.list /etc/apt/sources.list.d/*.sources 2>/dev/null \
  | grep -oE 'https?://[^ ]+/debian/?' | grep -v security | head -n1 || true)"
mirror="${mirror%/}"
[ -n "$mirror" ] || mirror="http://deb.debian.org/debian"

fetch() { # suite -> extracts the package's api.proto into cache/<suite>/api.proto
  local suite="$1" apt="$cache/apt-$1"
  if [ -s "$cache/$suite/api.proto" ]; then return; fi
  mkdir -p "$apt/lists/partial" "$apt/archives/partial" "$cache/$suite"
  echo "deb $mirror $suite main" >"$apt/sources.list"
  local opts=(-o "Dir::Etc::SourceList=$apt/sources.list" -o "Dir::Etc::SourceParts=/dev/null"
    -o "Dir::State::Lists=$apt/lists" -o "Dir::Cache=$apt" -o "APT::Get::List-Cleanup=0"
    -o "Acquire::Languages=none")
  apt-get "${opts[@]}" update -qq
  (cd "$apt" && apt-get "${opts[@]}" download golang-github-containerd-nri-dev >/dev/null)
  local deb
  deb="$(ls "$apt"/golang-github-containerd-nri-dev_*.deb | head -n1)"
  dpkg-deb -x "$deb" "$apt/root"
  local proto
  proto="$(find "$apt/root" -path '*containerd/nri/pkg/api/api.proto' | head -n1)"
  [ -n "$proto" ] || { echo "no api.proto in $deb" >&2; exit 1; }
  cp "$proto" "$cache/$suite/api.proto"
  basename "$deb" >"$cache/$suite/package"
  echo "upstream NRI proto from $(cat "$cache/$suite/package") -> $cache/$suite/api.proto"
}

fetch trixie
fetch sid
