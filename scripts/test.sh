#!/usr/bin/env bash
# Sets up (idempotently), builds the C++ tests, and runs every test: ctest, then pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export PATH="$PWD/.venv/bin:$PATH"
cmake -S . -B build/cpp -G Ninja -DZRL_BUILD_PYTHON=OFF -DZRL_BUILD_TESTS=ON -DCMAKE_BUILD_TYPE=Release > /dev/null
cmake --build build/cpp -j "$(nproc)"
(cd build/cpp && ctest --output-on-failure --timeout 300)
python -m pytest -q "$@"
