"""On a GPU, the Warp copies run on torch's current stream and can be captured in a CUDA graph."""

from __future__ import annotations

import pytest
import torch

from alchemi_core.warp_runtime import stream_for
from alchemi_warp.buffer_ops import WarpBufferOps

pytestmark = pytest.mark.gpu


def test_launches_follow_torch_current_stream():
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        assert stream_for(torch.device("cuda", side.device_index)).cuda_stream == side.cuda_stream
    default = torch.cuda.current_stream()
    assert stream_for(torch.device("cuda", default.device_index)).cuda_stream == default.cuda_stream


def test_copies_on_a_side_stream_are_ordered_with_torch_work():
    ops = WarpBufferOps(every_op=True)
    side = torch.cuda.Stream()
    src = torch.zeros(1 << 16, 3, device="cuda")
    index = torch.arange(1 << 16, device="cuda").flip(0)
    out = torch.empty_like(src)
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        src.fill_(2.0)  # torch work on the side stream; the gather must see it
        ops.gather(src, index, out)
        out.mul_(3.0)  # and torch work after the gather must see the gather's result
    side.synchronize()
    assert bool((out == 6.0).all())


def test_gather_and_zero_replay_in_a_cuda_graph():
    ops = WarpBufferOps(every_op=True)
    src = torch.randn(64, 3, device="cuda")
    index = torch.tensor([5, 0, 63, 7], device="cuda")
    out = torch.zeros(4, 3, device="cuda")
    flags = torch.ones(10, dtype=torch.bool, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm up: compile/load the module and wrap the stream
        ops.gather(src, index, out)
        ops.zero([flags])
    side.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=side):
        ops.gather(src, index, out)
        ops.zero([flags])
    src.copy_(torch.randn(64, 3, device="cuda"))
    flags.fill_(True)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, src[index])
    assert not flags.any()
