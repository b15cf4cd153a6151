"""Watch: follow a starting engine until it is ready or has failed (Launch -> Outcome, live events).

A step: may import start, push, render, remote, engines, profile and the leaves.
"""
