"""Export: the same profile (after `extends`, `--set`, flag translation and healing) as Kubernetes manifests.

Owns turning a `Profile` into plain manifest data (`k8s`) and checking manifests offline (`check`): built-in
kinds against the Kubernetes OpenAPI schemas (kubernetes-validate, strict), LeaderWorkerSet against its
vendored CRD schema, plus deployer's own rules (probes, GPU limits, no secret values). It never talks to a
cluster. May import profile, render, flags, engines and errors; nothing above it.
"""
