"""The attempt runner: one loop of bounded attempts for one host or a group of hosts (a node group), one restore.

`AttemptRunner` (attempts.py) owns one `up`'s attempts: the targets with their layouts, the profile, the options,
the event sink, the report, the local history rows, the changes tried and the version that was serving. Push,
stop what served, start, watch, diagnose, change, try again; when nothing works after the serving version was
stopped, bring it back (restore.py). What differs between a single host and a node group (how a group is pushed,
watched and diagnosed) is behind the small `Shape` interface (shape.py); the single host is a group of one.

    report.py   UpOptions, UpReport, AttemptReport (typed: Diagnosis, Change), their JSON
    timing.py   the waits and caps every stop/start shares (PORT_WAIT_S, the stop grace cap)
    logs.py     an attempt's log window and its diagnosis (single host, and a rank of a group)
    history.py  the local history rows of one `up` (off for the Python API)
    shape.py    HeldHost (one host in the run), Shape (the per-shape steps), SingleHostShape
    attempts.py AttemptRunner
    restore.py  bring back the previous version after a failed replace
"""
