"""Output for people (rich console, reports) and machines (NDJSON events, JSON, JUnit XML).

Layer below cli: may import the use cases (oncall, smoke, pipeline) and everything below; never cli.
"""
