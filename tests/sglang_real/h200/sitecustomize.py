"""Test-only: make this CPU host look like one H200 to SGLang's argument resolution.

Put this directory on PYTHONPATH of the test bed's "target" host (tests/sglang_real does). On releases with
`sglang.srt.runtime_context` (0.5.2x) it uses SGLang's own platform override and replaces only the
device-memory query its memory hook calls. Older releases (the seed era, 0.5.10) resolve everything in
`ServerArgs.__post_init__` with platform helpers imported by name into `sglang.srt.server_args`; those
names are replaced in that one module right after it loads (an import hook), so no other module (kernel
imports that check the platform) sees a fake GPU. Deployer's product code knows nothing about it.
FAKE_H200=0 turns the H200 off (not the torchvision fix below), FAKE_GPU_MIB sets the memory.

One more accommodation of this host: the only torchvision wheels on its disk are CUDA builds, whose C
ops cannot load on the CPU torch, and torchvision then fails at import registering fake kernels for
`torchvision::nms`/`qnms`. SGLang imports torchvision only for image transforms, never those ops; the
two schemas are declared here so the import succeeds.
"""

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
from typing import Any

H200_MIB = float(os.environ.get("FAKE_GPU_MIB", "143771"))
TORCHVISION_OPS = (
    "nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
)


def _declare_torchvision_ops() -> None:
    import glob
    import importlib.util

    import torch

    spec = importlib.util.find_spec("torchvision")  # finds, does not import
    if spec is None or not spec.submodule_search_locations:
        return
    for lib in glob.glob(os.path.join(list(spec.submodule_search_locations)[0], "_C*.so")):
        try:
            torch.ops.load_library(lib)
            return  # a torchvision that matches this torch: nothing to do
        except (OSError, RuntimeError):
            pass
    global _TV_LIB
    _TV_LIB = torch.library.Library("torchvision", "DEF")
    for schema in TORCHVISION_OPS:
        _TV_LIB.define(schema)


def _install() -> None:
    try:
        from sglang.srt import runtime_context
        from sglang.srt.arg_groups import memory_hook
    except ImportError:  # not an SGLang python: leave it alone
        return
    runtime_context.override_platform(is_cuda=True, is_hip=False, is_npu=False, is_xpu=False, is_musa=False,
                                      is_mps=False, is_sm90=True, device_sm=90, device_capability=(9, 0)).install()
    memory_hook.get_device_memory_capacity = lambda device=None: H200_MIB


# What an H200 host with a CUDA build of SGLang answers to the seed era's platform helpers.
_SEED_ERA_PLATFORM = {
    "is_cuda": True, "is_cuda_alike": True, "is_hip": False, "is_npu": False, "is_xpu": False, "is_mps": False,
    "is_cpu": False, "is_sm90_supported": True, "is_sm100_supported": False, "is_sm120_supported": False,
    "is_blackwell_supported": False, "is_hopper_with_cuda_12_3": True, "get_device_sm": 90,
    "get_device_name": "NVIDIA H200", "get_device": "cuda", "is_flashinfer_available": True,
}


def _fake_seed_era_platform(module: Any) -> None:
    for name, value in _SEED_ERA_PLATFORM.items():
        if hasattr(module, name):
            setattr(module, name, lambda *_a, _v=value, **_k: _v)
    if hasattr(module, "get_device_memory_capacity"):
        module.get_device_memory_capacity = lambda device=None: H200_MIB


class _PatchServerArgs(importlib.abc.MetaPathFinder):
    """After `sglang.srt.server_args` of a release without runtime_context loads, fake the platform in it."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname != "sglang.srt.server_args":
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None or importlib.util.find_spec("sglang.srt.runtime_context"):
            return spec
        loader = spec.loader
        original = loader.exec_module

        def exec_module(module: Any) -> None:
            original(module)
            _fake_seed_era_platform(module)

        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


try:
    _declare_torchvision_ops()
except ImportError:
    pass
if os.environ.get("FAKE_H200", "1") == "1":
    _install()
    sys.meta_path.insert(0, _PatchServerArgs())
