"""The deployment as the target keeps it: its runs, the current one, their records, states and outcomes.

May import remote, profile and the leaves (and the supervisor's constants); never a use case.
"""
