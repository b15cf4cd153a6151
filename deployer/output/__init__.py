"""Output for people (rich console, reports) and machines (NDJSON events, JSON, JUnit XML).

May import the use cases' report types and the watch events below it; never the cli.
"""
