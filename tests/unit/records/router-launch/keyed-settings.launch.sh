#!/usr/bin/env bash
# Launch script for the router qwen3-8b-fleet-router, rendered by deployer <version>.
# The supervisor runs it with the environment from ./env (0600); no secret is ever written here.
set -euo pipefail
cd -- "$(dirname -- "${BASH_SOURCE[0]}")"
exec /workspace/router-venv/bin/python -m smg launch --host 10.0.0.1 --port 8000 --policy cache_aware --prometheus-port 8001 --prometheus-host 10.0.0.1 --api-key "$DEPLOYER_SECRET_ROUTER_API_KEY" --health-check-interval-secs 5
