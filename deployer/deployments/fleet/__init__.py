"""A `replicas:` fleet: fan-out up, the router in front, rolling restarts, fleet status/down/logs/smoke.

The single-host steps do the work on each host: every replica is a single-host profile derived from the fleet
profile (`members`), deployed like any other deployment. One engine across nodes is deployer.deployments.nodes.
"""
