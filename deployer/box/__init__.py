"""The deployment as the target keeps it: its runs, the current one, their records, states and outcomes.

A step-level package (it reads the supervisor's status through `start` and the run dirs laid out by `push`):
may import start, push, render, remote, engines, profile and the leaves; never a use case.
"""
