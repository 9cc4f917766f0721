"""A forward that saves one storage twice, a value and its pass-through from a user sync's
``control_deps``, must not let the backward reuse that storage while reading it: AOT autograd
donates each saved tensor that shares storage with no input or output, without comparing the
saved tensors with each other, and inductor then wrote a gradient into memory a kernel still read
(a Linear's weight gradient 55.9 off; found by a compile fuzz of training loops).
"""

from __future__ import annotations

import pytest
import torch
import torch._dynamo

import streampass.inductor as spi

from reference import compile_and_compare

pytestmark = pytest.mark.usefixtures("fresh_caches")

S_C = torch.Stream("cpu")


def program(x, w, b, sync=True):
    v = torch.nn.functional.linear(x, w, b)
    with torch.Stream("cpu"):
        with S_C:
            u = v.reshape(8, 4).t() * v  # saves v, and v passed through the wait below
            if sync:
                e = torch.Event("cpu")
                e.record()
                e.wait()
        with S_C:
            y = u + 0
            y.narrow(1, 0, 3).mul_(2)
    return (y**2).mean()


def test_a_value_saved_with_its_pass_through_is_not_donated():
    inputs = (torch.randn(4, 8), torch.randn(8, 8), torch.randn(8))
    for run in ("cold", "warm"):  # the second compile finds torch's caches filled
        torch._dynamo.reset()
        p, _ = compile_and_compare(program, *inputs, training=True, eager=lambda *a: program(*a, sync=False))
        assert run == "warm" or [r.graph for r in p.reports] == ["forward", "backward"]


def test_saved_tensors_that_share_storage_are_found_through_pass_throughs():
    """The forward graph of ``program`` saves the matmul's result twice."""
    from torch._functorch.aot_autograd import aot_module_simplified

    from streampass.donated_buffers import shared_saved_tensors
    from streampass.serial import run_serial

    seen = []

    def forward_compiler(gm, example_inputs):
        context = torch._guards.TracingContext.get()
        meta = context.fw_metadata
        saved = list(gm.graph.output_node().args[0])[meta.tensors_saved_for_backwards_slice]
        shared = shared_saved_tensors(gm, meta.tensors_saved_for_backwards_slice, meta.num_forward)
        seen.append([saved[i] for i in sorted(shared) if saved[i].op != "placeholder"])
        return lambda *args: run_serial(gm, *args)  # CPU runs no event op: each sync is a no-op

    def backend(gm, example_inputs):
        return aot_module_simplified(gm, example_inputs, fw_compiler=forward_compiler, bw_compiler=lambda g, _: g)

    inputs = (torch.randn(4, 8), torch.randn(8, 8, requires_grad=True), torch.randn(8, requires_grad=True))
    with spi.enabled():
        torch.compile(program, backend=backend)(*inputs)
    (shared,) = seen
    # the matmul's result and its pass-through (torch 2.12 on), or a view of it (2.11): one storage saved twice
    assert len(shared) == 2, shared
