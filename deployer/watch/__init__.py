"""Watch: follow a starting engine until it is ready or has failed (Launch -> Outcome, live events).

May import start, target, remote, engines, profile and the leaves.
"""
