"""Many hosts (issue 14): a `replicas:` fleet (fan-out, the router in front, rolling restarts, fleet
status/down/logs/smoke) and one engine across nodes (`nodes*` modules).

The single-host pipeline does the work on each host: every replica or node is a single-host profile derived from
the fleet profile (`members`, `nodes_plan`), deployed with the single-host steps like any other deployment.
"""
