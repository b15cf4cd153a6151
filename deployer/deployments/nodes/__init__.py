"""One engine across nodes (`nodes:` profiles, multi-node tensor/pipeline parallelism): every node locked, checked,
pushed and started as one group.

    plan.py      the per-node profiles (ranks, dist-init address, NIC env) from the group profile
    net.py       what each node's network looks like (addresses, NICs, clocks)
    checks.py    the group's preflight: the nodes agree, the dist-init port is reachable
    render.py    every node's launch script (`deploy render`)
    dryrun.py    `deploy plan` of a group
    watch.py     NodeSession, watching rank 0 with every follower's supervisor
    diagnose.py  the rank that failed first, and its diagnosis
    up.py        the group as the attempt runner's Shape (deployer.runner), `up_nodes`
    ops.py       status, logs and down of every node
    scrape.py    every node's Prometheus scrape target
    deployment.py  NodeGroup, the Deployment interface over the above
"""
