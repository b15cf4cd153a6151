"""`deploy upgrade`: move a deployment's profile from the engine release it runs to another one.

`release` reads `--engine KIND==VERSION` and makes the profile that runs the new release (its own python or a managed
environment beside the old one); `compare` (pure) says what changes between the two releases for this profile, each
change with its source (a renames/follow-on table row, the release's flag table, its dry resolution); `plan` runs
preflight on both releases over one connection and builds that comparison; `save` writes the upgraded profile;
`carry` applies a plan made through one profile to another of the same engine (a fleet's, planned on its first
replica); `outcome` is what the command did, whatever the kind (`Deployment.upgrade`).

Lives under on-call (beside rollback) because it needs preflight, the runner's environment step and the target's
records, all below this layer.
"""
