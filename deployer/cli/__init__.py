"""The command line: argv -> calls into the use cases -> output and exit codes. No deployment logic.

Owns the click commands (`main`: the group, validate/render/schema; `targets`: up/status/logs/down/diagnose/
plan; `oncall`: history/restart/rollback; `smoke`), their shared options (`options`) and the mapping of the
error tree to exit codes. Top layer: may import every package; nothing imports it. Heavy modules are
imported inside the commands so that `deploy --help` starts fast.
"""
