"""Deployments: the one interface every command talks to, and its three kinds.

`base.Deployment` is the interface (up, plan, status, logs, history, diagnose, down, restart, rollback, prune,
smoke, export; room for prepare, top and ls). Each kind is a package of its own that implements it in its
`deployment` module: `single.deployment.SingleHost` (one box), `fleet.deployment.ReplicaFleet` (replicas behind a
router: its up, canary, rolling restarts, router, smoke, reports and scrape targets) and
`nodes.deployment.NodeGroup` (one engine across nodes); a fleet and a node group never import each other, and the
single host imports neither (the `kinds` import contract). `resolve.resolve` picks one from a profile file or a
name (+ --host) and the selectors (--node, --replica, --router); `reports` holds the typed reports the methods
return (each with `to_json()`, the JSON the CLI prints, and `exit_code`). The CLI and deployer.api call only this package; the single-host steps
every kind is made of stay below it, in the runner and operate packages.

The package imports nothing itself: `deploy status NAME` imports only what a single host's status needs
(resolve loads the kinds a profile file names when it names one).
"""
