"""What this machine (the one `deploy` runs on) knows, in one place, all of it under `DEPLOYER_HOME` or the user's
config dir: the local history of deployments, attempts and events (`history`), the user's defaults and where each
comes from (`settings`), the single-host profile files an earlier command loaded (`remembered`), and which host and
workdir a bare NAME means (`lookup`). The targets stay the source of truth; this is what lets a command on this
machine skip a profile load or a question."""
