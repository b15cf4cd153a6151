#!/usr/bin/env bash
# Launch script for the router qwen3-8b-fleet-router, rendered by deployer <version>.
# The supervisor runs it with the environment from ./env (0600); no secret is ever written here.
set -euo pipefail
cd -- "$(dirname -- "${BASH_SOURCE[0]}")"
exec python3 -c 'import json, os, sys; from smg.cli import main; argv = sys.argv[1:]; [argv.extend([flag, *json.loads(os.environ[var])] if many else [flag + "=" + os.environ[var]]) for flag, var, many in json.loads(os.environ.get("DEPLOYER_SMG_SECRET_ARGS") or "[]")]; main(argv)' launch --host 10.0.0.1 --port 8000 --policy cache_aware --prometheus-port 8001 --prometheus-host 10.0.0.1
