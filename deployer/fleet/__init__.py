"""Many hosts: a `replicas:` fleet (fan-out, the router in front, rolling restarts, fleet status/down/logs/smoke).

The single-host pipeline does the work on each host: every replica is a single-host profile derived from the
fleet profile (`members`), deployed with `pipeline.up.up` like any other deployment.
"""
