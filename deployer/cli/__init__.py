"""The command line: argv -> one call on a Deployment (deployer.deployments) -> output and exit codes. No
deployment logic and no choice between kinds of deployment.

Owns the click commands (`main`: the lazy group and the error -> exit code mapping; `profiles`: validate/render/
schema; `targets`: up/status/logs/down/diagnose/plan; `oncall`: history/restart/rollback/prune; `smoke`;
`export`), their shared options (`options`) and how reports are shown (`show`, by report type). Top layer: may
import every package; nothing imports it. Command modules are imported when their command runs (main.LazyGroup),
so they import at their top and `deploy --help` stays fast.
"""
