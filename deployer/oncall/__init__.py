"""On-call operations on an existing deployment: status, logs, down, history, diagnose NAME, restart, rollback.

Everything is read from the target, so these work from any laptop. May import the pipeline and everything
below it (steps, target, remote, render, profile, errors); never output or cli.
"""
