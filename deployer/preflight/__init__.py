"""Preflight: facts from the target (GPUs, disk, ports, engine version, flag table) -> report + fixes.

`facts` gathers them in one round trip, `flags` checks the profile's flags against the target's own parser,
`memory` plans GPU memory, `checks` puts it together. A step: may import start, remedy, push, render,
remote, engines, profile and the leaves; never another step of its layer (watch, diagnose, target).
"""
