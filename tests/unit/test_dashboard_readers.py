"""deployer/dashboard/readers.py: the CLI's `--json` outputs (status of a deployment, a fleet and a node group,
history, plan of either engine, drift lines) read into the dashboard's typed values."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from deployer.dashboard import GpuMemory, attempts_from_history, drift_from_lines, memory_from_plan, with_phases
from deployer.dashboard.model import LastCrash, OverviewRow
from deployer.dashboard.readers import row_of_member, row_of_status
from deployer.deployments.reports import FleetStatus
from deployer.operate.rows import NodeFacts, StatusRow
from deployer.diagnose.drift import Drift as EngineDrift
from deployer.engines.sglang.memory import MemoryPlan
from deployer.engines.vllm.memory import VllmMemoryPlan

MIB = 1 << 20
STATUS = {"name": "qwen", "host": "root@gpu", "status": "ready", "pid": 4242, "uptime_s": 12.5, "healthy": True,
          "attempt": 2, "content_hash": "abc", "run_dir": "/w/qwen/runs/2", "port": 30000, "restarts": 1,
          "last_crash": None, "exit_code": None, "signal_name": None, "drift": [], "runs": 2, "diagnosis": None,
          "lock": None, "serving": True}


def test_a_status_row_of_each_shape_gets_its_kind() -> None:
    single = row_of_status(StatusRow.of(STATUS), "qwen@gpu", engine="sglang", version="0.5.23")
    assert (single.kind, single.member, single.engine, single.engine_version, single.serving) == \
        ("deployment", None, "sglang", "0.5.23", True)
    node = row_of_status(replace(StatusRow.of(STATUS), node=NodeFacts(1, "dummy health")), "qwen-n1")
    assert (node.kind, node.member) == ("node", "1")


def test_a_fleet_status_gives_its_replicas_then_its_router() -> None:
    replica: dict[str, Any] = {**STATUS, "role": "replica", "index": 0, "member": "r0", "url": "http://a:1",
                               "alias": "gpu-1"}
    absent = {"name": "chat-r1", "host": "gpu-2", "status": "absent", "healthy": False, "serving": False,
              "role": "replica", "index": 1, "member": "r1"}
    router = {**STATUS, "name": "chat-router", "role": "router", "index": None, "member": "router"}
    fleet = {"name": "chat", "serving": False, "code": 6, "replicas": [replica, absent], "router": router}
    members = FleetStatus(fleet, 6).members
    assert [(m.role, m.index, m.tag, m.host, m.row is not None) for m in members] == [
        ("replica", 0, "r0", "gpu-1", True), ("replica", 1, "r1", "gpu-2", False), ("router", None, "router",
                                                                                  "root@gpu", True)]
    rows = [row_of_member(m, f"chat-{m.tag}", engine="sglang") for m in members]
    assert [(r.key, r.kind, r.member, r.status, r.host, r.engine, r.pid) for r in rows] == [
        ("chat-r0", "replica", "r0", "ready", "root@gpu", "sglang", 4242),
        ("chat-r1", "replica", "r1", "absent", "gpu-2", "sglang", None),
        ("chat-router", "router", "router", "ready", "root@gpu", "sglang", 4242)]
    assert rows[0] == replace(row_of_status(StatusRow.of(replica), "chat-r0", engine="sglang"), kind="replica",
                              member="r0")  # a present member's row is its typed status row's
    assert [m.tag for m in FleetStatus({**fleet, "router": None}, 6).members] == ["r0", "r1"]


def test_history_becomes_the_timeline_oldest_first_without_the_lock_rows() -> None:
    first = {"kind": "attempt", "run_id": "r1", "attempt": 1, "outcome": "crashed", "current": False,
             "change": {"args": {"mem_fraction_static": 0.8}, "env": {}, "reason": "less", "basis": {}},
             "diagnosis": {"signature": "cuda-oom"}, "drift": [], "restarts": 0, "started_at": 1.0}
    second = {**first, "run_id": "r2", "attempt": 2, "outcome": "ready", "current": True, "change": None,
              "diagnosis": None, "started_at": 2.0}
    lock = {"kind": "lock", "started_at": 3.0, "outcome": "lock-taken-over", "detail": "x took over", "by": {}}
    timeline = attempts_from_history([lock, second, first])
    assert [(a.run_id, a.healed) for a in timeline] == [("r1", True), ("r2", False)]
    phased = with_phases(timeline[0], [{"phase": "start", "elapsed": 0.0}, {"phase": "load_weights", "elapsed": 4.2}])
    assert [(p.phase, p.elapsed) for p in phased.phases] == [("start", 0.0), ("load_weights", 4.2)]
    assert phased.change == timeline[0].change and with_phases(timeline[1], []) == timeline[1]


def test_drift_lines_become_rows() -> None:
    lines = [EngineDrift("context_length", 65536, 32768).describe(),
             EngineDrift("enable_foo", True, kind="unknown").describe(),
             EngineDrift("tags", ["a", "b"], None).describe(),
             "something else"]
    rows = drift_from_lines(lines)
    assert [(d.flag, d.asked, d.resolved, d.kind) for d in rows] == [
        ("context_length", "65536", "32768", "changed"), ("enable_foo", "true", None, "unknown"),
        ("tags", "[\"a\", \"b\"]", "None", "changed"), ("something else", None, None, "other")]


def test_the_memory_plan_of_sglang_is_stacked_per_gpu() -> None:
    plan = MemoryPlan(gpu_total_mib=81559, gpu_free_mib=80000, weights_per_gpu_mib=30000.0, mem_fraction_static=0.8,
                      mfs_auto=True, reserved_mib=3000.0, kv_cell_bytes=4096, kv_tokens=100 * 256, context_len=8192,
                      max_running_requests=48, mamba_state_bytes=64 * MIB, mamba_slots=96)
    gpus = memory_from_plan(plan.to_json(), [{"index": 0, "name": "H100", "total_mib": 81559},
                                             {"index": 1, "name": "H100", "total_mib": 81559}])
    assert [g.gpu for g in gpus] == [0, 1]
    first = gpus[0]
    assert (first.weights_mib, first.kv_mib, first.mamba_mib, first.graphs_mib, first.other_mib) == \
        (30000.0, 100.0, 6144.0, 0.0, 3000.0)
    assert first.headroom_mib == 81559 - 39244



def test_the_memory_plan_of_vllm_is_stacked_per_gpu() -> None:
    plan = VllmMemoryPlan(gpu_total_mib=40960, gpu_free_mib=40000, gpu_memory_utilization=0.9, requested_mib=36864,
                          weights_per_gpu_mib=15000.0, non_torch_mib=768.0, activation_mib=2000.0,
                          cuda_graph_mib=1800.0, kv_memory_mib=17296.0, block_size=16, bytes_per_block=1,
                          kv_blocks=1, kv_tokens=16, max_model_len=4096, max_num_seqs=8)
    (gpu,) = memory_from_plan(plan.to_json())
    assert (gpu.gpu, gpu.total_mib, gpu.kv_mib, gpu.graphs_mib, gpu.other_mib) == (0, 40960, 17296.0, 1800.0, 2768.0)
    assert gpu.to_json()["headroom_mib"] == 40960 - 36864
    assert not GpuMemory(gpu=0, total_mib=10, weights_mib=12).headroom_mib > 0



CRASHLOOP = {**STATUS, "status": "crashloop", "pid": None, "uptime_s": None, "healthy": False, "serving": False,
             "restarts": 1, "engine": "sglang", "engine_version": "0.5.10", "model": "Qwen/Qwen3-8B",
             "last_crash": {"at": 1700000000.0, "exit_code": 1, "signal": None, "signal_name": None,
                            "diagnosis": {"signature": "cuda-oom", "summary": "out of memory", "hint": "less"}},
             "diagnosis": None, "lock": {"holder": "ops@laptop", "text": "locked by ops@laptop"},
             "unhealthy": None, "metrics": None}


def test_a_typed_status_row_gives_every_field_status_shows() -> None:
    """The typed row `deploy status --json` prints from: engine and version from the run's record (not the
    profile's guess), the crash loop, the last crash's diagnosis when the run has none of its own, the lock holder."""
    row = row_of_status(StatusRow.of(CRASHLOOP), "qwen@gpu", engine="vllm", version="9.9")
    assert (row.engine, row.engine_version, row.model, row.status, row.crash_loop) == \
        ("sglang", "0.5.10", "Qwen/Qwen3-8B", "crashloop", True)
    assert row.diagnosis is not None and (row.diagnosis.signature, row.diagnosis.summary, row.diagnosis.hint) == \
        ("cuda-oom", "out of memory", "less")
    assert row.last_crash == LastCrash(at=1700000000.0, exit_code=1, signal_name=None)
    assert (row.lock, row.restarts, row.run_dir, row.port) == ("locked by ops@laptop", 1, "/w/qwen/runs/2", 30000)
    own = row_of_status(StatusRow.of({**CRASHLOOP, "diagnosis": {"signature": "mine", "summary": "s"}}), "k")
    assert own.diagnosis is not None and own.diagnosis.signature == "mine"
    fine = row_of_status(StatusRow.of({**STATUS, "metrics": None, "unhealthy": None}), "k", engine="vllm",
                         version="0.32.0")
    assert (fine.crash_loop, fine.diagnosis, fine.lock, fine.engine, fine.engine_version) == \
        (False, None, None, "vllm", "0.32.0")   # a record that names none: the profile's
    assert OverviewRow.from_json(row.to_json()) == row          # what the server sends reads back the same
