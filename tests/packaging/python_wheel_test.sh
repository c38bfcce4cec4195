#!/bin/sh
# Packaging test of the Python package (bindings/python/pyproject.toml):
#   python_wheel_test.sh [SOURCE_DIR [MODELS_DIR]]
# Each route runs in fresh virtual environments under one temporary folder:
#  1. `pip install SOURCE_DIR/bindings/python`, then `import libllm` with no
#     LLM_LIB/LLM_LIB_DIR/LD_LIBRARY_PATH, then the binding tests;
#  2. `python -m build --wheel` in a builder venv, the wheel installed in
#     another clean venv, then the binding tests again.
# The binding tests (bindings/python/test_libllm.py) run from a copy outside
# the source tree, so they import the installed package, and read the models
# from MODELS_DIR (default: $LLM_MODELS_DIR, else SOURCE_DIR/../shared/models).
# Exit 77 (ctest skip): no `python3 -m venv`, or pip cannot fetch the build
# backend (no network). Each pip/build step is bounded by `timeout`
# (LLM_WHEEL_STEP_TIMEOUT seconds, default 1800). A build compiles libllm;
# CMAKE_BUILD_PARALLEL_LEVEL defaults to 2 and ccache is used when installed,
# so the second build reuses the first one's objects.
set -u
here=$(cd "$(dirname "$0")" && pwd)
src=$(cd "${1:-$here/../..}" && pwd)
models=${2:-${LLM_MODELS_DIR:-$src/../shared/models}}
step_timeout=${LLM_WHEEL_STEP_TIMEOUT:-1800}
python=${PYTHON:-python3}

unset LLM_LIB LLM_LIB_DIR LD_LIBRARY_PATH PYTHONPATH PYTHONHOME PIP_REQUIRE_VIRTUALENV
export PYTHONDONTWRITEBYTECODE=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1
export CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-2}
export LLM_MODELS_DIR="$models"

work=$(mktemp -d "${TMPDIR:-/tmp}/llm-wheel-test.XXXXXX") || exit 1
trap 'rm -rf "$work"' EXIT
trap 'exit 130' INT TERM

if command -v ccache >/dev/null 2>&1 && [ -z "${CMAKE_CXX_COMPILER_LAUNCHER:-}" ]; then
  # Both builds live at the same depth under $work: relative to it, their
  # compile commands are the same, so ccache hits on the second one.
  export CMAKE_C_COMPILER_LAUNCHER=ccache CMAKE_CXX_COMPILER_LAUNCHER=ccache
  export CCACHE_BASEDIR="$work" CCACHE_NOHASHDIR=1
fi

fail() {
  echo "FAIL: $*"
  exit 1
}

# run LOG CMD...: CMD under the step timeout, its output in LOG (printed on failure).
run() {
  log=$1
  shift
  echo "+ $*"
  timeout "$step_timeout" "$@" >"$log" 2>&1
  rc=$?
  [ "$rc" -eq 0 ] && return 0
  tail -n 60 "$log"
  [ "$rc" -eq 124 ] && fail "timed out after ${step_timeout}s: $*"
  fail "exit $rc: $*"
}

# binding_tests VENV: import check, then test_libllm.py against the installed package.
binding_tests() {
  py="$1/bin/python"
  mkdir -p "$1/tests"
  cp "$src/bindings/python/test_libllm.py" "$1/tests/"
  (cd "$1/tests" && "$py" -c '
import os, sys
import libllm
print("libllm", libllm.version_string(), libllm.version(), "from", libllm.__file__)
pkg = os.path.dirname(os.path.abspath(libllm.__file__))
assert pkg.startswith(os.path.realpath(sys.prefix)) or pkg.startswith(sys.prefix), pkg
assert os.path.abspath(libllm._lib._name) == os.path.join(pkg, "libllm.so"), libllm._lib._name
assert os.path.exists(os.path.join(pkg, "py.typed"))
from importlib.metadata import version
assert version("libllm") == libllm.version_string(), (version("libllm"), libllm.version_string())
') || fail "import libllm in $1"
  (cd "$1/tests" && timeout "$step_timeout" "$py" -m unittest test_libllm) || fail "binding tests in $1"
}

if ! "$python" -m venv "$work/probe" >"$work/probe.log" 2>&1; then
  cat "$work/probe.log"
  echo "python3 -m venv does not work (Debian: python3-venv): skipping"
  exit 77
fi
if ! timeout 120 "$work/probe/bin/pip" download --no-deps --timeout 20 --retries 1 -d "$work/probe-dl" \
    scikit-build-core build >"$work/probe-dl.log" 2>&1; then
  tail -n 5 "$work/probe-dl.log"
  echo "pip cannot fetch the build backend (no network?): skipping"
  exit 77
fi
[ -f "$models/stories260K.gguf" ] || fail "no $models/stories260K.gguf (pass MODELS_DIR or set LLM_MODELS_DIR)"

echo "== 1. pip install ./bindings/python"
"$python" -m venv "$work/venv-pip" || fail "venv"
SKBUILD_BUILD_DIR="$work/build-pip" run "$work/pip-install.log" \
  "$work/venv-pip/bin/pip" install -v "$src/bindings/python"
binding_tests "$work/venv-pip"

echo "== 2. python -m build --wheel, installed in a clean venv"
"$python" -m venv "$work/venv-build" || fail "venv"
run "$work/pip-build.log" "$work/venv-build/bin/pip" install build
SKBUILD_BUILD_DIR="$work/build-whl" run "$work/build-wheel.log" \
  "$work/venv-build/bin/python" -m build --wheel --outdir "$work/dist" "$src/bindings/python"
set -- "$work"/dist/libllm-*.whl
[ $# -eq 1 ] && [ -f "$1" ] || fail "expected one wheel in $work/dist: $*"
wheel=$1
echo "wheel: $(basename "$wheel")"
"$work/venv-build/bin/python" - "$wheel" <<'PY' || fail "wheel contents"
import sys, zipfile
names = set(zipfile.ZipFile(sys.argv[1]).namelist())
need = {"libllm/__init__.py", "libllm/libllm.so", "libllm/py.typed"}
missing = need - names
extra = [n for n in names if not n.startswith(("libllm/", "libllm-"))]
print("\n".join(sorted(names)))
assert not missing, "missing: %s" % sorted(missing)
assert not extra, "outside the package: %s" % extra
PY
"$python" -m venv "$work/venv-whl" || fail "venv"
run "$work/pip-wheel.log" "$work/venv-whl/bin/pip" install --no-index "$wheel"
binding_tests "$work/venv-whl"

echo "python_wheel_test: OK"
