# Shared by scripts/run, scripts/test and the other scripts: install what is missing, set up the
# project's Python environment, configure and build. Sourced, not run. Everything these functions
# print goes to standard error, so that a script's standard output is only what the script itself
# reports (./scripts/run --format json > report.json holds the report and nothing else).

TPARITY_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

# Debian packages the build needs. libtorch-dev is LibTorch 1.13, the second reference (build-debian);
# libopenblas0-pthread: without it Debian's LibTorch falls back to the reference BLAS, about 8x slower.
# ccache: the torch-free libraries and tests compile alike in build/ and build-debian/ (and again
# after a checkout): each is compiled once.
TPARITY_PACKAGES=(cmake g++ make python3 libtorch-dev catch2 libfmt-dev nlohmann-json3-dev libcli11-dev
  libopenblas0-pthread ccache)

# The project-local virtual environment, from requirements.txt (pinned in full): torch==2.13.0, whose
# wheel carries LibTorch 2.13, the default reference, and the Python side (numpy, safetensors,
# transformers, the pretrained model's package). TPARITY_VENV names another one.
TPARITY_VENV="${TPARITY_VENV:-$TPARITY_ROOT/.venv}"
TPARITY_PYTHON="$TPARITY_VENV/bin/python"

tparity_install_missing() {
  local missing=() p
  for p in "$@"; do
    grep -q "install ok installed" <<<"$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null)" || missing+=("$p")
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
  {
    "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -q &&
      "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}"
  } >&2
}

# tparity_venv: creates .venv when missing and installs requirements.txt into it, requirements-nodeps.txt
# without their dependencies (a package wanted for the file it ships), then the Python
# package python/ (editable: `import tparity` is this checkout's), whenever either changed since the
# last install (their hash is kept in .venv). pip reads every package from the pinned file, torch from
# the 2.13.0 CPU wheel, so it never resolves a torch of its own; the package is installed with
# --no-deps --no-build-isolation (setuptools is pinned in the file), so nothing else is fetched.
tparity_venv() {
  local req="$TPARITY_ROOT/requirements.txt" nodeps="$TPARITY_ROOT/requirements-nodeps.txt"
  local stamp="$TPARITY_VENV/.requirements.sha256" want
  want="$(cat "$req" "$nodeps" "$TPARITY_ROOT/python/pyproject.toml" | sha256sum | cut -d' ' -f1)"
  if [ -x "$TPARITY_PYTHON" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$want" ]; then
    return 0
  fi
  echo "tparity: installing requirements.txt into $TPARITY_VENV" >&2
  if [ ! -x "$TPARITY_PYTHON" ]; then
    if ! python3 -m venv "$TPARITY_VENV" >&2; then
      # Debian's own python3 keeps venv in a separate package.
      rm -rf "$TPARITY_VENV"
      tparity_install_missing python3-venv
      python3 -m venv "$TPARITY_VENV" >&2
    fi
  fi
  "$TPARITY_PYTHON" -m pip install --disable-pip-version-check -q -r "$req" >&2
  "$TPARITY_PYTHON" -m pip install --disable-pip-version-check -q --no-deps -r "$nodeps" >&2
  "$TPARITY_PYTHON" -m pip install --disable-pip-version-check -q --no-deps --no-build-isolation \
    -e "$TPARITY_ROOT/python" >&2
  echo "$want" >"$stamp"
}

# The compiler cache inside the checkout (.ccache, ignored by git; paths below the root hashed as
# relative, so two checkouts or two build folders share entries), for every build when ccache is
# installed: tparity_cmake_launcher prints the cmake argument.
export CCACHE_DIR="${CCACHE_DIR:-$TPARITY_ROOT/.ccache}" CCACHE_BASEDIR="${CCACHE_BASEDIR:-$TPARITY_ROOT}"
export CCACHE_MAXSIZE="${CCACHE_MAXSIZE:-2G}"
# The reference's files compile against a precompiled header (CMakeLists.txt): ccache caches them, and
# the header itself, only when told that the header's macros and __TIME__ may be taken as they are.
export CCACHE_SLOPPINESS="${CCACHE_SLOPPINESS:-pch_defines,time_macros}"
tparity_cmake_launcher() {
  if command -v ccache >/dev/null 2>&1; then
    echo "-DCMAKE_CXX_COMPILER_LAUNCHER=ccache"
  else
    echo "-DCMAKE_CXX_COMPILER_LAUNCHER="
  fi
}

# tparity_build DIR [cmake args...]: configure once, build with two jobs (the machines have two
# cores). The reference is LibTorch 2.13 from .venv unless the arguments say otherwise
# (-DTPARITY_TORCH=debian or off).
tparity_build() {
  local dir="$1"
  shift
  {
    cmake -S "$TPARITY_ROOT" -B "$dir" -DCMAKE_BUILD_TYPE=Release -DTPARITY_PYTHON="$TPARITY_PYTHON" \
      "$(tparity_cmake_launcher)" "$@" >/dev/null &&
      cmake --build "$dir" -j2
  } >&2
}
