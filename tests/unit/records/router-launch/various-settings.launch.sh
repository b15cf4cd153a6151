#!/usr/bin/env bash
# Launch script for the router qwen3-8b-fleet-router, rendered by deployer <version>.
# The supervisor runs it with the environment from ./env (0600); no secret is ever written here.
set -euo pipefail
cd -- "$(dirname -- "${BASH_SOURCE[0]}")"
exec '/opt/r v/bin/python' -m smg launch --host 0.0.0.0 --port 65535 --policy round_robin --prometheus-host 0.0.0.0 --api-key "$DEPLOYER_SECRET_ROUTER_API_KEY" --control-plane-api-keys "$DEPLOYER_SECRET_ROUTER_CONTROL_PLANE_API_KEYS" --enable-trace --offset=-3 --prometheus-port 9100 --request-id-headers '{"a": "z", "b": 1}' --retry-delays 1 2.5 'x y' --served-model-name 'a b; $(touch /tmp/pwned) `x`'
