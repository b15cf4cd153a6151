"""A deployment on one GPU box (`SingleHost`): the kind every other kind is composed of. Its steps are the runner's
(up) and operate's (status, down, logs, rollback, upgrade); its smoke is deployer.smoke."""
