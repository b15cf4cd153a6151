"""What a box needs before an engine can start, got before anything is stopped: the managed engine environment
(`engine.install`) and, later, the weights.

- `envspec`: the environment's identity (a content hash of what it contains), where it lives on the target
  (`<workdir>/.deployer/envs/<hash>/`), the record of a built one, and which ones retention keeps.
- `install_plan`: the argv lists that build it on the target (uv when there, pip otherwise), honouring the target's
  own pip configuration; the dry resolution first; the atomic build-and-rename under a lock (the protocol).
- `diagnose_install` + `failures.yaml`: a failed pip/uv run said in one line, from their real output.
- `compat` + `compat.yaml`: the compatibility preflight (driver CUDA vs the torch build, compute capability vs the
  engine's kernels, Python vs wheel tags, /dev/shm, free disk), each rule data with its source.

- `environment`: the steps on a target (probe, dry resolution, compat, the build by the helper's `env_build` under
  its lock, reuse, retention), reached through two callables the runner makes from its connection.
- `report`: what `deploy prepare` did on each host.

Only `environment` talks to a target, through those callables (this package sits below the remote layer); the
target-side helper (supervisor/install.py) runs the argv lists and hands back their output.
"""
