"""The use case `up`: render -> push -> start -> watch -> diagnose -> remedy -> retry, bounded, with its report.

`up` composes the steps; `before_launch` runs preflight and heals what it can see before the first launch;
`early_push` pushes attempt 1's run dir while preflight runs.
May import every step (preflight, watch, diagnose, target, start, remedy, push), render, remote, engines,
profile and the leaves; never oncall, smoke, output or cli.
"""
