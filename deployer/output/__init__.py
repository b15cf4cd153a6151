"""Output for people (rich console, reports) and machines (NDJSON events, JSON, JUnit XML).

Layer below cli: may import the use cases (operate, smoke, runner) and everything below; never cli.
"""
