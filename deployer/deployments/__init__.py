"""Deployments: the one interface every command talks to, and its three kinds.

`base.Deployment` is the interface (up, plan, status, logs, history, diagnose, down, restart, rollback, prune,
smoke, export; room for prepare, top and ls); `single.SingleHost`, `fleet.ReplicaFleet` and `nodes.NodeGroup`
implement it; `resolve.resolve` picks one from a profile file or a name (+ --host) and the selectors
(--node, --replica, --router); `reports` holds the typed reports the methods return (each with `to_json()`, the
JSON the CLI prints, and `exit_code`). The CLI and deployer.api call only this package; the work itself stays in
the runner, operate, fleet and nodes packages.

The package imports nothing itself: `deploy status NAME` imports only what a single host's status needs
(resolve loads the kinds a profile file names when it names one).
"""
