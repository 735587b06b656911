#!/usr/bin/env bash
# Installs the deltafin Python package into a virtual environment, the one documented way
# (`make python` runs it; so does the pytest CTest, into a temporary folder): a venv over
# Debian's python3 with --system-site-packages (numpy and pytest come from Debian's
# python3-numpy / python3-pytest; no PyPI), then pip without build isolation or an index, with
# the built libdeltafin.so bundled into the package.
#   usage: python/install.sh VENV LIBDELTAFIN_SO [SOURCE_DIR]
# Exit status 77 (skip) when the interpreter cannot make a venv or lacks numpy.
set -euo pipefail
venv=$1
lib=$2
src=${3:-"$(cd "$(dirname "$0")" && pwd)"}
py=${DELTAFIN_PYTHON:-/usr/bin/python3}
[ -x "$py" ] || py=$(command -v python3 || true)
if [ -z "$py" ]; then echo "no python3 found (install python3)" >&2; exit 77; fi
if ! "$py" -c 'import ensurepip, venv' 2>/dev/null; then
  echo "$py cannot make virtual environments (install python3-venv)" >&2; exit 77
fi
if ! "$py" -c 'import numpy' 2>/dev/null; then
  echo "$py has no numpy (install python3-numpy)" >&2; exit 77
fi
if [ ! -f "$lib" ]; then echo "$lib does not exist: build the library first" >&2; exit 1; fi
"$py" -m venv --system-site-packages "$venv"
DELTAFIN_LIB=$(realpath "$lib") "$venv/bin/python" -m pip install --quiet --no-index \
  --no-build-isolation --disable-pip-version-check "$src"
echo "installed deltafin into $venv (activate: . $venv/bin/activate)"
