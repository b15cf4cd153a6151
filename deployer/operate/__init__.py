"""Operating an existing single-host deployment (the on-call commands): status, logs, down (`deployment`),
history and diagnose NAME (`history`), restart and rollback (`rollback`).

Everything is read from the target, so these work from any laptop. Layer beside smoke, below output: may
import pipeline and everything below it; never smoke, output or cli.
"""
