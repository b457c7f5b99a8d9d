#!/usr/bin/env bash
# Sets up (idempotently), builds the C++ tests, and runs every test: ctest, then pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
ZRL_EXTRAS=test,atari,export,video,plot bash scripts/setup.sh
export PATH="$PWD/.venv/bin:$PATH"
# C++: kernels, replay, libzrl_client and its examples, and their GoogleTests.
cmake -S . -B build/cpp -G Ninja -DZRL_BUILD_PYTHON=OFF -DZRL_BUILD_TESTS=ON -DZRL_BUILD_CLIENT=ON -DCMAKE_BUILD_TYPE=Release > /dev/null
cmake --build build/cpp -j "$(nproc)"
(cd build/cpp && ctest --output-on-failure --timeout 300)
# pytest runs the C++ example simulator from this build; require it rather than skip.
export ZRL_CPP_BUILD_DIR="$PWD/build/cpp" ZRL_REQUIRE_CPP=1
python -m pytest -q "$@"
