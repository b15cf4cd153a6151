"""The command line: argv -> calls into the use cases -> output and exit codes. No deployment logic.

Owns the click commands (`main`: validate/render/schema; `targets`: up/status/logs/down/diagnose/plan;
`oncall`: history/restart/rollback; `smoke`) and the mapping of the error tree to exit codes.
May import anything below it (output, oncall, smoke, pipeline, steps, profile, errors); nothing imports it.
Heavy modules are imported inside the commands so that `deploy --help` starts fast.
"""
