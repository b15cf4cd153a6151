#!/usr/bin/env bash
# Launch script for the router qwen3-8b-fleet-router, rendered by deployer <version>.
# The supervisor runs it with the environment from ./env (0600); no secret is ever written here.
set -euo pipefail
cd -- "$(dirname -- "${BASH_SOURCE[0]}")"
exec '/opt/r v/bin/python' -c 'import json, os, sys; from smg.cli import main; argv = sys.argv[1:]; [argv.extend([flag, *json.loads(os.environ[var])] if many else [flag + "=" + os.environ[var]]) for flag, var, many in json.loads(os.environ.get("DEPLOYER_SMG_SECRET_ARGS") or "[]")]; main(argv)' launch --host 0.0.0.0 --port 65535 --policy round_robin --prometheus-host 0.0.0.0 --worker-urls http://10.0.0.1:30000 http://10.0.0.2:30001 --enable-trace --offset=-3 --prometheus-port 9100 --request-id-headers '{"a": "z", "b": 1}' --retry-delays 1 2.5 'x y' --served-model-name 'a b; $(touch /tmp/pwned) `x`'
