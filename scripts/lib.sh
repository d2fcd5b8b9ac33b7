# Shared by scripts/run and scripts/test: install what is missing, then configure and build.
# Sourced, not run.

TPARITY_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

# Debian packages the build needs. libopenblas0-pthread: without it Debian's LibTorch falls back to
# the reference BLAS, about 8x slower.
TPARITY_PACKAGES=(cmake g++ make libtorch-dev catch2 libfmt-dev nlohmann-json3-dev libcli11-dev libopenblas0-pthread)

tparity_install_missing() {
  local missing=() p
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  echo "tparity: installing missing Debian packages: ${missing[*]}" >&2
  local sudo=()
  if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1; then
      sudo=(sudo)
    else
      echo "tparity: need root or sudo to install: ${missing[*]}" >&2
      return 1
    fi
  fi
  # A fresh machine has empty package lists: update once before installing.
  "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -q &&
    "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}"
}

# tparity_build DIR [cmake args...]: configure once, build with two jobs (the machines have two cores).
tparity_build() {
  local dir="$1"
  shift
  cmake -S "$TPARITY_ROOT" -B "$dir" -DCMAKE_BUILD_TYPE=Release "$@" >/dev/null &&
    cmake --build "$dir" -j2
}
