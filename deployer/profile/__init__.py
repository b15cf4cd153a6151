"""Deployment profiles: the strict Pydantic model (`model`), loading (`loader`: YAML with file:line, extends,
${VAR}, --set), host addresses (`host`) and writing back the profile that worked (`fixed`).

Layer above the leaves only: may import errors and third-party libraries; every other package builds on it.
"""
