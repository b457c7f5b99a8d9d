#!/usr/bin/env bash
# Installs everything zrl needs on a fresh Debian machine (run as root), idempotently:
# apt packages (ZeroMQ, cppzmq, GoogleTest), a venv in .venv with torch==2.13.0 (CPU),
# and zrl itself in editable mode, which builds the C++ extension into ./zrl.
set -euo pipefail
cd "$(dirname "$0")/.."

APT_PACKAGES=(g++ pkg-config libzmq3-dev cppzmq-dev libgtest-dev libgmock-dev)
missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ! python3 -c "import venv, ensurepip" 2>/dev/null; then missing+=(python3-venv); fi
if [ ${#missing[@]} -gt 0 ]; then
  echo "[setup] apt-get install ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" > /dev/null
fi

if [ ! -x .venv/bin/python ]; then
  echo "[setup] creating .venv"
  python3 -m venv .venv
fi
PIP=(.venv/bin/python -m pip --disable-pip-version-check -q)
"${PIP[@]}" install --upgrade pip setuptools wheel
# torch is pinned here, not in the package: a bare `torch` pulls a multi-GB CUDA build.
"${PIP[@]}" install torch==2.13.0
"${PIP[@]}" install "pybind11>=2.12" "cmake>=3.18" ninja
echo "[setup] building zrl (C++ extension + editable install)"
# ZRL_EXTRAS: the extras to install (scripts/test.sh adds those its tests need).
"${PIP[@]}" install --no-build-isolation -e ".[${ZRL_EXTRAS:-test,atari}]"
.venv/bin/python -c "import zrl._core, torch; print('[setup] ok: zrl', __import__('zrl').__version__, 'torch', torch.__version__)"
