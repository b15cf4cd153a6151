# Sourced by scripts/build-{sglang,vllm,smg}-venv.sh: the shared steps of building a CPU-only venv with an engine's
# real code in it (its argument parser runs on this CPU; no GPU, no CUDA torch).
#
#   cpu_venv_begin DIR STAMP WHAT       lock DIR, and exit 0 (saying so) when it is already built for STAMP
#   cpu_venv_new DIR                    an empty venv in DIR; PIP becomes its quiet `pip install --no-compile`
#   cpu_venv_lock DIR                   one builder per DIR: a second build waits for the first (fd 9)
#   cpu_venv_fresh DIR STAMP            true when DIR holds a venv built for exactly STAMP
#   cpu_venv_build DIR WHAT TORCH NODEPS_ARRAY DEPS_ARRAY
#                                       rebuild DIR: the local CPU torch, then NODEPS with --no-deps (their
#                                       requirements name a CUDA torch), then DEPS; refuse a venv whose torch
#                                       pip replaced with a CUDA build
#   cpu_venv_cpu_torch DIR WHAT         refuse (exit 1) a venv whose torch is a CUDA build
#   cpu_venv_done DIR STAMP START       record the stamp (after the caller's smoke passed)

cpu_venv_lock() {
  mkdir -p "$(dirname "$1")"
  exec 9>"$1.lock"
  flock 9
}

cpu_venv_begin() {
  cpu_venv_lock "$1"
  if cpu_venv_fresh "$1" "$2"; then
    echo "$3 up to date: $1"
    exit 0
  fi
}

cpu_venv_new() {
  rm -rf "$1"
  "${PY:-python3}" -m venv "$1"
  # --no-compile: pip byte-compiles every module it installs (~90,000 files across the tiers' venvs, ~4 ms each:
  # most of a cold build's CPU), while an engine imports a few thousand of them, compiled once on first import
  PIP=("$1/bin/python" -m pip install --quiet --disable-pip-version-check --no-compile)
}

cpu_venv_fresh() {
  [[ -x "$1/bin/python" && -f "$1/.stamp" && "$(cat "$1/.stamp")" == "$2" ]]
}

cpu_venv_build() {
  local dir=$1 what=$2 torch=$3
  local -n nodeps=$4 deps=$5
  cpu_venv_new "$dir"
  "${PIP[@]}" "torch==$torch"
  "${PIP[@]}" --no-deps "${nodeps[@]}"
  "${PIP[@]}" "${deps[@]}"
  cpu_venv_cpu_torch "$dir" "$what"
}

cpu_venv_cpu_torch() {
  if ! "$1/bin/python" -c 'import sys, torch; sys.exit(0 if torch.version.cuda is None else 1)'; then
    echo "$2: pip replaced the CPU torch with a CUDA one; refusing this venv" >&2
    exit 1
  fi
}

cpu_venv_done() {
  echo "$2" > "$1/.stamp"
  echo "built $1 in $(( $(date +%s) - $3 ))s"
}
