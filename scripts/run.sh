#!/usr/bin/env bash
# Sets up (idempotently) and trains the default config: IMPALA on CartPole-v1,
# one learner and 2 actor processes over ZeroMQ. Extra arguments go to `zrl run`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/zrl run "$@"
