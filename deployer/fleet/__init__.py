"""Many hosts (issue 14): replicas behind a router, and one engine across nodes (`nodes*` modules).

A layer of its own between export and oncall/smoke: it drives the single-host pipeline once per host.
"""
