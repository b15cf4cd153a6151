"""Test-only: make this CPU host look like one H200 to SGLang's argument resolution.

Put this directory on PYTHONPATH of the test bed's "target" host (tests/sglang_real does). It uses SGLang's
own platform override and replaces only the device-memory query its memory hook calls; deployer's
product code knows nothing about it. FAKE_H200=0 turns the H200 off (not the torchvision fix below), FAKE_GPU_MIB sets the memory.

One more accommodation of this host: the only torchvision wheels on its disk are CUDA builds, whose C
ops cannot load on the CPU torch, and torchvision then fails at import registering fake kernels for
`torchvision::nms`/`qnms`. SGLang imports torchvision only for image transforms, never those ops; the
two schemas are declared here so the import succeeds.
"""

import os

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


try:
    _declare_torchvision_ops()
except ImportError:
    pass
if os.environ.get("FAKE_H200", "1") == "1":
    _install()
