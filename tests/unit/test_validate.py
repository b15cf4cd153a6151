"""`deploy validate` (issue 24): every profile problem listed, unknown keys first, each with file:line and a
did-you-mean; engine.args checked offline against the flag table cached for the pinned (else newest) version."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from deployer.errors import ProfileError, ProfileProblems
from deployer.preflight.flags import Flag, FlagSet, check_offline, save_flagset
from deployer.profile.loader import load_profile

REPO = Path(__file__).resolve().parents[2]

GOOD = """\
name: demo
target:
  host: gpu-box
engine:
  kind: sglang
  model_path: Qwen/Qwen3-8B
  args:
    tp_size: 1
"""


def cli(*argv: str, home: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "deployer.cli", *argv], capture_output=True, text=True, timeout=60,
                          env={"PATH": os.environ["PATH"], "DEPLOYER_HOME": str(home)}, cwd=str(REPO))


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "p.yaml"
    path.write_text(text)
    return path


def table(version: str, *extra: str) -> FlagSet:
    names = ["--tp-size", "--context-length", "--mem-fraction-static", "--max-running-requests", *extra]
    return FlagSet("sglang", version, tuple(Flag((n,), n[2:].replace("-", "_")) for n in names))


def test_a_misspelt_required_key_shows_both_problems_unknown_first(tmp_path: Path) -> None:
    """`targt:` used to give `target: required field is missing (+1 more problem)`."""
    path = write(tmp_path, GOOD.replace("target:", "targt:"))
    with pytest.raises(ProfileProblems) as info:
        load_profile(path)
    lines = [str(p) for p in info.value.problems]
    assert lines[0].startswith(f"{path}:2: targt: unknown key 'targt' (did you mean 'target'?)")
    assert lines[1] == f"{path}:2: target: required field is missing ('targt' at line 2 looks like a misspelling of it)"
    assert "more problem" not in str(info.value)
    assert str(info.value).startswith(f"{path}: 2 problems:\n  {lines[0]}\n  {lines[1]}")


def test_every_problem_is_listed_with_its_line(tmp_path: Path) -> None:
    text = GOOD.replace("  model_path:", "  modle_path:").replace("kind: sglang", "kind: sglng\n  port: lots") + \
        "helth:\n  path: /x\n"
    path = write(tmp_path, text)
    with pytest.raises(ProfileProblems) as info:
        load_profile(path)
    lines = [str(p) for p in info.value.problems]
    assert [ln.split(": ")[1] for ln in lines] == ["engine.modle_path", "helth", "engine.kind", "engine.port",
                                                  "engine.model_path"]
    assert lines[0].startswith(f"{path}:7: engine.modle_path: unknown key 'modle_path' (did you mean 'model_path'?)")
    assert lines[1].startswith(f"{path}:10: helth: unknown key 'helth' (did you mean 'health'?)")
    assert lines[2] == f"{path}:5: engine.kind: unknown engine kind 'sglng' (known: sglang, vllm); did you mean 'sglang'?"
    assert lines[3].startswith(f"{path}:6: engine.port: Input should be a valid integer")
    assert lines[4] == (f"{path}:7: engine.model_path: required field is missing ('modle_path' at line 7 looks like a "
                        "misspelling of it)")


def test_one_problem_stays_one_line(tmp_path: Path) -> None:
    path = write(tmp_path, GOOD.replace("kind: sglang", "kind: sglng"))
    with pytest.raises(ProfileError) as info:
        load_profile(path)
    assert not isinstance(info.value, ProfileProblems)
    assert str(info.value) == (f"{path}:5: engine.kind: unknown engine kind 'sglng' (known: sglang, vllm); "
                               "did you mean 'sglang'?")


def test_validate_cli_lists_them_all_and_exits_2(tmp_path: Path) -> None:
    path = write(tmp_path, GOOD.replace("target:", "targt:").replace("  model_path:", "  modle_path:"))
    out = cli("validate", str(path), home=tmp_path / "home")
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert out.stderr.startswith(f"error: {path}: 4 problems:\n")
    assert [ln.split(": ")[1] for ln in out.stderr.splitlines()[1:]] == ["targt", "engine.modle_path", "target",
                                                                        "engine.model_path"]


def test_engine_args_are_checked_against_the_newest_cached_table_saying_which(tmp_path: Path) -> None:
    home = tmp_path / "home"
    save_flagset(home / "cache", table("0.5.10"))
    save_flagset(home / "cache", table("0.5.23"))
    path = write(tmp_path, GOOD + "    context_lenght: 4096\n    zzq_totally_unknown: 7\n")
    out = cli("validate", str(path), home=home)
    assert out.returncode == 2, out.stderr
    assert ("engine.args checked against the cached flag table of sglang 0.5.23 (the newest cached; the profile "
            "pins no engine.version)") in out.stderr
    assert (f"{path}:9: engine.args.context_lenght: unknown flag --context-lenght for sglang 0.5.23; did you mean "
            "--context-length? (`up` would respell it; write it as context_length)") in out.stderr
    assert (f"{path}:10: engine.args.zzq_totally_unknown: unknown flag --zzq-totally-unknown for sglang 0.5.23 "
            "(no flag of it is close); refused") in out.stderr
    good = cli("validate", str(write(tmp_path, GOOD)), home=home)
    assert good.returncode == 0 and "checked against the cached flag table of sglang 0.5.23" in good.stdout


def test_the_pinned_version_s_table_is_used_when_cached(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    save_flagset(cache, table("0.5.10", "--only-in-old"))
    save_flagset(cache, table("0.5.23"))
    prof = load_profile(write(tmp_path, GOOD.replace("kind: sglang", "kind: sglang\n  version: 0.5.10") +
                              "    only_in_old: 1\n"))
    check = check_offline(prof, [cache])
    assert (check.version, check.basis) == ("0.5.10", "engine.version pins it") and check.strict_problems() == []
    pinned_uncached = load_profile(write(tmp_path, GOOD.replace("kind: sglang", "kind: sglang\n  version: 0.5.9")))
    check = check_offline(pinned_uncached, [cache])
    assert (check.version, check.basis) == ("0.5.23", "the newest cached; engine.version 0.5.9 has no cached table")
    none = check_offline(prof, [tmp_path / "empty"])
    assert none.version is None and none.strict_problems() == []
    assert none.basis.startswith("no flag table of sglang is cached yet")


def test_no_cached_table_says_flags_were_not_checked(tmp_path: Path) -> None:
    out = cli("validate", str(write(tmp_path, GOOD + "    zzq_totally_unknown: 7\n")), home=tmp_path / "home")
    assert out.returncode == 0, out.stderr
    assert "engine.args not checked: no flag table of sglang is cached yet" in out.stdout


SCHEMA_BROKEN = [  # (what is written instead, the schema problems' fields): elsewhere, in the engine, its model
    (("target:", "targt:"), ["targt", "target"]),
    (("  args:", "  port: lots\n  args:"), ["engine.port"]),
    (("  model_path:", "  modle_path:"), ["engine.modle_path", "engine.model_path"]),
]


@pytest.mark.parametrize(("change", "schema"), SCHEMA_BROKEN, ids=["target", "engine-port", "model-path"])
def test_schema_and_flag_problems_come_in_one_run(tmp_path: Path, change: tuple[str, str], schema: list[str]) -> None:
    """Issue 36: a schema error used to hide the flag errors, so it took two rounds to see every problem."""
    home = tmp_path / "home"
    save_flagset(home / "cache", table("0.5.23"))
    path = write(tmp_path, GOOD.replace(*change) + "    context_lenght: 4096\n")
    out = cli("validate", str(path), home=home)
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    assert f"error: {path}: {len(schema) + 1} problems:\n" in out.stderr, out.stderr
    fields = [ln.split(": ")[1] for ln in out.stderr.splitlines() if ln.startswith(f"  {path}:")]
    assert fields == [*schema, "engine.args.context_lenght"], out.stderr
    assert "engine.args checked against the cached flag table of sglang 0.5.23" in out.stderr


def test_an_unreadable_engine_section_leaves_the_schema_problems_as_they_were(tmp_path: Path) -> None:
    home = tmp_path / "home"
    save_flagset(home / "cache", table("0.5.23"))
    path = write(tmp_path, GOOD.replace("kind: sglang", "kind: sglng") + "    context_lenght: 4096\n")
    out = cli("validate", str(path), home=home)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert out.stderr.strip().splitlines()[-1].startswith(f"error: {path}:5: engine.kind: unknown engine kind")
