# Sourced by the scripts that build: makes the toolchain rust-toolchain.toml
# pins usable without a download when the machine's stable toolchain is that
# same release (machines whose only registry is crates.io cannot fetch one).
# Otherwise rustup installs the pin itself on the first cargo call.
ensure_pinned_toolchain() {
  command -v rustup >/dev/null || return 0
  local pin stable_dir host
  pin=$(sed -n 's/^channel *= *"\(.*\)"/\1/p' rust-toolchain.toml)
  [ -n "$pin" ] || return 0
  if rustup toolchain list | grep -q "^$pin"; then return 0; fi
  if rustup run stable rustc --version 2>/dev/null | grep -q "^rustc $pin "; then
    # rustup refuses `toolchain link` under a release's name; a link in its
    # toolchains directory is what it reads as installed.
    stable_dir=$(dirname "$(dirname "$(rustup which --toolchain stable rustc)")")
    host=$(rustup run stable rustc -vV | sed -n 's/^host: //p')
    echo "toolchain: $pin is the installed stable; linking it" >&2
    ln -sfn "$stable_dir" "$(dirname "$stable_dir")/$pin-$host"
  fi
}
ensure_pinned_toolchain
