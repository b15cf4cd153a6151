"""Preflight: facts from the target (GPUs, disk, ports, engine version, flag table) -> report + fixes.

`facts` gathers them in one round trip, `flags` checks the profile's flags against the target's own parser,
`checks` puts it together with the engine's own memory plan (Engine.memory). A step: may import start,
remedy, push, render, remote, engines, profile and the leaves; never another step of its layer (watch,
diagnose, target).
"""
