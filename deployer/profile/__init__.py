"""Deployment profiles: the strict Pydantic model, loading (YAML with file:line, extends, ${VAR}, --set) and
writing back the profile that worked (`fixed`).

May import only the leaves (errors) and third-party libraries: every other package builds on it.
"""
