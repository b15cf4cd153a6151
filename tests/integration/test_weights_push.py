"""A model directory on the controller pushed to the target (`engine.weights.push`, issue 25), end to end over the
real sshd: pushed before anything is stopped into `<workdir>/.deployer/models/<content>/`, nothing sent again when
it is there, a push cut short resumed from what was staged, a file changed on the target found and sent again, and
the stand-in engine started from the pushed copy under the directory's own name."""

from __future__ import annotations

import hashlib
import json
import os
import stat
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from deploy_helpers import deploy, events, write_profile

pytestmark = pytest.mark.integration

WEIGHTS = 3_000_000


def model_dir(root: Path) -> Path:
    """A tiny model directory: config, tokenizer, weights and a file in a subfolder."""
    folder = root / "models" / "my-finetune"
    (folder / "extra").mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "intermediate_size": 128, "vocab_size": 256, "max_position_embeddings": 512,
        "torch_dtype": "bfloat16"}))
    (folder / "tokenizer.json").write_text(json.dumps({"version": "1.0"}))
    block = hashlib.sha256(b"finetune").digest() * 4096
    (folder / "model.safetensors").write_bytes((block * (WEIGHTS // len(block) + 1))[:WEIGHTS])
    (folder / "extra" / "notes.txt").write_text("trained on Tuesday\n")
    return folder


def content_of(folder: Path) -> str:
    """The content hash as deployer defines it: sha256 of `name\\0size\\0sha256\\n` per file, sorted by name."""
    files = sorted(p for p in folder.rglob("*") if p.is_file())
    lines = "".join(f"{p.relative_to(folder).as_posix()}\0{p.stat().st_size}\0"
                    f"{hashlib.sha256(p.read_bytes()).hexdigest()}\n" for p in files)
    return hashlib.sha256(lines.encode()).hexdigest()


def push_profile(tmp_path: Path, sshd: Any, name: str) -> Path:
    return write_profile(tmp_path, sshd, name=name, model="models/my-finetune",
                         extra={"engine": {"weights": {"push": True}}})


def pushed_row(result: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    row: dict[str, Any] = json.loads(result.stdout.splitlines()[-1])["environments"][0]["weights"]
    return row


def test_up_pushes_the_directory_and_the_engine_starts_from_it_and_a_second_up_sends_nothing(
        tmp_path: Path, sshd: Any) -> None:
    folder = model_dir(tmp_path)
    content = content_of(folder)
    prof = push_profile(tmp_path, sshd, "wpush")
    home = tmp_path / "home"
    planned = json.JSONDecoder().raw_decode(deploy("plan", str(prof), "--json", home=home).stdout.lstrip())[0]
    total = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
    assert planned["weights"]["pushed"] == content and planned["weights"]["missing_bytes"] == total, planned
    assert not [w for w in planned["warnings"] if "no memory estimate" in w], planned["warnings"]  # read from here
    # the engine's dry resolution reads the model: not there before the first push, so skipped and said
    assert planned["resolution"] == "after the push", planned["resolution"]
    assert any("dry resolution skipped: my-finetune is pushed after preflight" in w for w in planned["warnings"])
    made = deploy("up", str(prof), "--skip-preflight", "--json", home=home)
    try:
        assert made.returncode == 0, made.stdout[-2000:] + made.stderr[-3000:]
        run_dir = Path(json.loads(made.stdout.splitlines()[-1])["run_dir"])
        there = tmp_path / "work" / ".deployer" / "models" / content
        assert f"standin: weights from {there}" in (run_dir / "engine.log").read_text()
        for p in folder.rglob("*"):
            if p.is_file():
                assert (there / p.relative_to(folder)).read_bytes() == p.read_bytes()
        assert not stat.S_IMODE(os.stat(there.parent).st_mode) & 0o022  # nobody else writes there
        record = json.loads((run_dir / "profile.json").read_text())
        engine = record["profile"]["engine"] if "profile" in record else record["engine"]
        assert engine["weights"]["pushed"] == content and engine["model_path"] == str(there)
        assert engine["args"]["served_model_name"] == "my-finetune" and engine["env"]["HF_HUB_OFFLINE"] == "1"
        seen = events(made.stdout)
        phases = [e for e in seen if e.get("event") == "phase" and e.get("phase") == "pushing weights"]
        attempts = [e for e in seen if e.get("event") == "attempt"]
        assert phases and attempts and phases[0]["at"] < attempts[0]["at"]  # pushed before the launch
        assert not list(there.parent.glob(".staging-*")) and not list(there.parent.glob(".chunks-*"))
        # render shows what up launched: the engine on the pushed copy (the same script, hence the same hash)
        shown = deploy("render", str(prof), "--json", home=home)
        assert shown.returncode == 0, shown.stderr[-2000:]
        rendered = json.loads(shown.stdout)
        assert str(there) in rendered["argv"] and str(folder) not in shown.stdout, rendered["argv"]
        assert f"the engine loads the copy of {folder} pushed to {there}" in shown.stderr, shown.stderr
        assert rendered["content_hash"] == json.loads(made.stdout.splitlines()[-1])["content_hash"]

        again = deploy("up", str(prof), "--skip-preflight", home=home)
        assert again.returncode == 0, again.stderr[-2000:]
        said = again.stdout + again.stderr
        assert "already there" in said and "already running" in said, said
        after = json.JSONDecoder().raw_decode(deploy("plan", str(prof), "--json", home=home).stdout.lstrip())[0]
        assert after["weights"]["missing_bytes"] == 0 and after["weights"]["fits"]
        assert after["resolution"] == "done", after["resolution"]   # against the copy there now
    finally:
        deploy("down", str(prof), home=home)


def test_a_push_cut_short_resumes_and_a_file_changed_on_the_target_is_sent_again(tmp_path: Path,
                                                                                  sshd: Any) -> None:
    folder = model_dir(tmp_path)
    content = content_of(folder)
    prof = push_profile(tmp_path, sshd, "wresume")
    home = tmp_path / "home"
    first = pushed_row(deploy("prepare", str(prof), "--json", home=home))
    total = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
    assert first["pushed"] == content and first["sent_bytes"] == total
    models = tmp_path / "work" / ".deployer" / "models"
    there, staging = models / content, models / f".staging-{content}"
    weights = (folder / "model.safetensors").read_bytes()

    # a push that was cut: its files staged, the weights half there, the directory not in place yet
    there.rename(staging)
    with open(staging / "model.safetensors", "r+b") as fh:
        fh.truncate(1_000_000)
    resumed = pushed_row(deploy("prepare", str(prof), "--json", home=home))
    assert resumed["sent_bytes"] == WEIGHTS - 1_000_000, resumed  # only the rest of the one file
    assert (there / "model.safetensors").read_bytes() == weights and not staging.exists()

    # a staged part that is not what was sent: found by its sha256 and sent again whole
    there.rename(staging)
    with open(staging / "model.safetensors", "r+b") as fh:
        fh.truncate(1_000_000)
        fh.seek(10)
        fh.write(b"garbage")
    repaired = deploy("prepare", str(prof), "--json", home=home)
    assert repaired.returncode == 0, repaired.stderr[-3000:]
    row = pushed_row(repaired)
    assert row["sent_bytes"] == WEIGHTS - 1_000_000 + WEIGHTS, row
    assert "sending it again" in repaired.stdout + repaired.stderr
    assert (there / "model.safetensors").read_bytes() == weights

    # a file of the pushed directory changed on the target: said, and sent again
    with open(there / "model.safetensors", "r+b") as fh:
        fh.seek(WEIGHTS // 2)
        fh.write(b"bitrot")
    fixed = deploy("prepare", str(prof), "--json", home=home)
    assert fixed.returncode == 0, fixed.stderr[-3000:]
    assert pushed_row(fixed)["sent_bytes"] == WEIGHTS
    assert "model.safetensors on" in fixed.stdout + fixed.stderr and "not what was pushed" in \
        fixed.stdout + fixed.stderr
    assert (there / "model.safetensors").read_bytes() == weights
    assert pushed_row(deploy("prepare", str(prof), "--json", home=home))["sent_bytes"] == 0


def test_a_symlink_in_the_directory_and_a_models_dir_others_can_write_are_refused_in_one_line(
        tmp_path: Path, sshd: Any) -> None:
    folder = model_dir(tmp_path)
    (folder / "link.json").symlink_to(folder / "config.json")
    prof = push_profile(tmp_path, sshd, "wrefuse")
    home = tmp_path / "home"
    refused = deploy("prepare", str(prof), home=home)
    assert refused.returncode == 2 and "Traceback" not in refused.stderr, refused.stderr  # the local folder: bad input
    assert "link.json is a symbolic link" in refused.stdout + refused.stderr
    assert not (tmp_path / "work" / ".deployer" / "models").exists()

    (folder / "link.json").unlink()
    models = tmp_path / "work" / ".deployer" / "models"
    models.mkdir(parents=True)
    models.chmod(0o777)
    unsafe = deploy("prepare", str(prof), home=home)
    assert unsafe.returncode == 4 and "Traceback" not in unsafe.stderr, unsafe.stderr
    assert "writable by everyone" in unsafe.stdout + unsafe.stderr
    assert os.listdir(models) == []


def test_a_rollback_loads_the_directory_it_ran_with_and_says_so_when_it_is_gone(tmp_path: Path, sshd: Any) -> None:
    from test_oncall import oncall

    folder = model_dir(tmp_path)
    v1 = content_of(folder)
    prof = push_profile(tmp_path, sshd, "wpushrb")
    home = tmp_path / "home"
    first = deploy("up", str(prof), "--skip-preflight", "--json", home=home)
    assert first.returncode == 0, first.stderr[-3000:]
    (folder / "extra" / "notes.txt").write_text("trained again on Wednesday\n")
    v2 = content_of(folder)
    second = deploy("up", str(prof), "--skip-preflight", "--json", home=home)
    try:
        assert second.returncode == 0, second.stderr[-3000:]
        models = tmp_path / "work" / ".deployer" / "models"
        run2 = Path(json.loads(second.stdout.splitlines()[-1])["run_dir"])
        assert f"standin: weights from {models / v2}" in (run2 / "engine.log").read_text()
        sent = [e["message"] for e in events(second.stdout) if str(e.get("message", "")).startswith("weights ")]
        assert sent and "27 B sent" in sent[0], sent  # only the changed file travelled, the rest are linked
        assert (models / v1 / "model.safetensors").stat().st_ino == (models / v2 / "model.safetensors").stat().st_ino
        back = oncall(sshd, tmp_path, "rollback", "wpushrb", "--json")
        assert back.returncode == 0, back.stdout[-2000:] + back.stderr[-2000:]
        run1 = Path(json.loads(back.stdout.splitlines()[-1])["run_dir"])
        assert f"standin: weights from {models / v1}" in (run1 / "engine.log").read_text()

        import shutil
        shutil.rmtree(models / v2)
        gone = oncall(sshd, tmp_path, "rollback", "wpushrb")
        assert gone.returncode == 4 and "Traceback" not in gone.stderr, gone.stderr
        assert f"the weights pushed as {v2[:12]} are no longer on" in gone.stderr, gone.stderr
    finally:
        deploy("down", str(prof), home=home)


def aged(*paths: Path, days: float = 2.0) -> None:
    """As if last pushed or reused `days` ago (the retention keeps what was used within a day)."""
    then = time.time() - days * 24 * 3600
    for p in paths:
        os.utime(p, (then, then), follow_symlinks=False)


def test_a_pushed_directory_no_kept_run_loads_goes_with_retention_and_prune_says_so(tmp_path: Path,
                                                                                   sshd: Any) -> None:
    """Three versions of a fine-tune pushed one after another (keep_runs 1): the first one's runs go, and its
    directory with them once a day has passed since it was last used; the one rollback would load stays. `deploy
    prune --dry-run` counts the runs it would delete, and changes nothing."""
    folder = model_dir(tmp_path)
    prof = write_profile(tmp_path, sshd, name="wprune", model="models/my-finetune",
                         extra={"engine": {"weights": {"push": True}}, "retention": {"keep_runs": 1}})
    home, models = tmp_path / "home", tmp_path / "work" / ".deployer" / "models"
    versions = []
    try:
        for n in range(3):
            (folder / "extra" / "notes.txt").write_text(f"version {n}\n")
            versions.append(content_of(folder))
            if n == 2:   # the first version: no longer used for two days
                aged(models / versions[0], models / f".{versions[0]}.verified.json")
            made = deploy("up", str(prof), "--skip-preflight", "--force", home=home)
            assert made.returncode == 0, made.stdout[-2000:] + made.stderr[-3000:]
        said = made.stdout + made.stderr
        assert f"removed 1 pushed model dir(s) no kept run loads ({versions[0][:12]})" in said, said[-3000:]
        assert "  sending " in said and "downloading" not in said, said[-3000:]   # a push's progress lines
        assert not (models / versions[0]).exists() and not (models / f".{versions[0]}.verified.json").exists()
        assert (models / versions[1]).is_dir() and (models / versions[2]).is_dir()  # rollback's and the current

        # the second version's run is rollback's target: kept, and what it loads with it, however old
        aged(models / versions[1], models / f".{versions[1]}.verified.json")
        dry = deploy("prune", str(prof), "--keep", "1", "--dry-run", "--json", home=home)
        assert dry.returncode == 0, dry.stderr[-2000:]
        assert json.loads(dry.stdout)["models"]["removed"] == [], dry.stdout

        # a directory pushed by `prepare` that no run ever loaded, unused for two days: prune says it, then does it
        (folder / "extra" / "notes.txt").write_text("never launched\n")
        orphan = content_of(folder)
        assert pushed_row(deploy("prepare", str(prof), "--json", home=home))["pushed"] == orphan
        fresh = deploy("prune", str(prof), "--json", home=home)
        assert json.loads(fresh.stdout)["models"]["recent"] == [orphan], fresh.stdout  # pushed just now: stays
        aged(models / orphan, models / f".{orphan}.verified.json")
        shown = deploy("prune", str(prof), "--dry-run", home=home)
        assert f"would delete the pushed model dir {orphan[:12]}" in shown.stdout, shown.stdout
        assert (models / orphan).is_dir()
        gone = deploy("prune", str(prof), "--json", home=home)
        assert json.loads(gone.stdout)["models"]["removed"] == [orphan], gone.stdout
        assert json.loads(gone.stdout)["models"]["freed_bytes"] > 0
        assert not (models / orphan).exists() and (models / versions[2]).is_dir()
    finally:
        deploy("down", str(prof), home=home)
