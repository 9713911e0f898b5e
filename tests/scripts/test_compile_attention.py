"""compile_attention.py: the Triton attention kernels compile, without a GPU, to what an H100
runs (sm_90), on the path the interpreter tests cannot reach (`for` loops, bf16 tensor-core
products, the pipeliner): at DLRMv4's widths (128) in bf16 nothing spills, the loops' loads
are asynchronous copies and the products are wgmma (with the widths as runtime arguments, the
column mask split the bf16 loads into 2-byte ones the pipeliner could not copy)."""

from __future__ import annotations

from tests.scripts import load_script


def test_bf16_kernels_compile_for_sm90_pipelined_on_tensor_cores_without_spills():
    script = load_script("compile_attention")
    compiled = script.compile_all(["bf16"], (128, 128), arch=90)
    assert [c.kernel for c in compiled] == ["_forward_kernel", "_dq_kernel", "_dkdv_kernel"]
    for c in compiled:
        assert c.spilled_bytes == 0 and c.registers <= 255, c
        assert c.async_copies > 0 and c.tensor_core_ops > 0, c
        assert c.shared_bytes <= 227 * 1024, c  # an H100 SM's shared memory per block
