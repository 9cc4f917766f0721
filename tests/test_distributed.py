"""Distributed training under StreamPass, on a one-rank gloo group.

* ``DistributedDataParallel`` compiled: DDP's optimizer splits the graph at its gradient buckets,
  and every piece goes through StreamPass.
* Inductor's collective bucketing, which runs after StreamPass: merged across streams, it would
  race on a GPU, so StreamPass refuses it there by name (streampass/collective_buckets.py). The
  GPU lowering is compiled on CPU and its generated code read by tests/test_native_lowering.py's
  race detector.
"""

from __future__ import annotations

import copy
import re

import pytest
import torch
import torch._inductor.config as inductor_config
import torch.distributed as dist
import torch.distributed._functional_collectives as fc
from test_native_lowering import native_codes, unwaited_reads

import streampass as sp
import streampass.inductor as spi
from streampass import collective_buckets, compat

pytestmark = [
    pytest.mark.usefixtures("fresh_caches", "one_rank"),
    pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(), reason="torch built without gloo"),
]


@pytest.fixture
def one_rank():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


class Residual(torch.nn.Module):
    """Six residual layers, each on one of two side streams in turn."""

    def __init__(self, width=256, layers=6):
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(width, width) for _ in range(layers))

    def forward(self, x):
        for i, layer in enumerate(self.layers):
            with sp.stream(1 + i % 2):
                branch = torch.relu(layer(x))
            x = x + branch
        return x.pow(2).mean()


def test_data_parallel_training_goes_through_streampass_piece_by_piece():
    """``torch.compile(DDP(model))`` with 1 MB gradient buckets: DDP's optimizer compiles the
    forward in two pieces, and AOT autograd their backward; three steps equal eager's."""
    torch.manual_seed(0)
    model = Residual()
    ref = copy.deepcopy(model)
    step = torch.compile(torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=1))
    opts = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (model, ref)]
    p = sp.StreamPass(keep_graphs=True)
    for _ in range(3):
        x = torch.randn(8, 256)
        with spi.enabled(p):
            loss = step(x)
        want = ref(x)
        torch.testing.assert_close(loss, want, rtol=1e-5, atol=1e-6)
        for out, opt in zip((loss, want), opts):
            out.backward()
            opt.step()
            opt.zero_grad()
    torch.testing.assert_close(model.state_dict(), ref.state_dict(), rtol=1e-5, atol=1e-6)
    kinds = [r.graph for r in p.reports]
    assert kinds.count("forward") == kinds.count("backward") == 2, kinds  # DDP's split: two pieces
    assert all(r.streams == [0, 1, 2] and sp.verify(r.verified_graph).ok for r in p.reports)


def _all_reduce(t):
    return fc.all_reduce(t, "sum", dist.group.WORLD)


def _reduce_scatter(t):
    return fc.reduce_scatter_tensor(t, "sum", 0, dist.group.WORLD)


def _all_gather(t):
    return fc.all_gather_tensor(t, 0, dist.group.WORLD)


#: the bucketing setting -> the collective it merges
COLLECTIVES = {
    "bucket_all_reduces_fx": _all_reduce,
    "bucket_reduce_scatters_fx": _reduce_scatter,
    "bucket_all_gathers_fx": _all_gather,
}


def two_streams(collective):
    """One collective of gradients on the ambient stream, one of the side stream's work on it:
    the overlap a data-parallel step wants."""

    def f(x, w, v):
        g = x @ w
        a = collective(g)
        with sp.stream(1):
            r = collective(v.sin()) * 2
        return r + torch.relu(a)

    return f


def one_stream(collective):
    """Both collectives on the ambient stream, a side stream's work next to them."""

    def f(x, w, v):
        a = collective(x @ w)
        b = collective(v.sin())
        with sp.stream(1):
            k = x.cos() * 2
        return a.relu() + b * 2 + k

    return f


def chained(collective):
    """The second collective reduces what the first returned (tensor parallelism's pattern):
    torch never merges a collective with one it depends on."""

    def f(x, w, v):
        a = collective(x @ w)
        with sp.stream(1):
            c = collective(a.sin()) * 2
        return c + v.sum()

    return f


_COLLECTIVE_CALL = re.compile(
    r"^\s*(?:buf\d+ = )?torch\.ops\._c10d_functional\.(all_reduce_|reduce_scatter_tensor|all_gather_into_tensor\w*)\."
)


def collective_calls(code: str) -> int:
    """How many collectives the generated code launches."""
    return sum(1 for line in code.splitlines() if _COLLECTIVE_CALL.match(line))


def _inputs():
    return torch.randn(8, 8), torch.randn(8, 8), torch.randn(8, 8)


@pytest.fixture(params=sorted(COLLECTIVES))
def setting(request):
    with inductor_config.patch({request.param: "all"}):
        yield request.param


#: torch 2.11 and 2.12 issue every kernel of a GPU graph on one stream: a merge moves nothing across
ON_STREAMS = compat.INDUCTOR_ISSUES_ON_STREAMS and compat.LOWERING_ORDERS_AFTER_SYNCS


def test_a_merge_across_streams_would_read_without_the_plans_waits(setting, monkeypatch):
    """Why StreamPass refuses: without the refusal, the merged collective's copies run on one
    stream and read what the other stream's kernels wrote, unwaited."""
    monkeypatch.setattr(collective_buckets, "refuse_across_streams", lambda a: None)
    codes = native_codes(monkeypatch, two_streams(COLLECTIVES[setting]), *_inputs())
    assert len(codes) == 1 and bool(unwaited_reads(codes[0])) == ON_STREAMS


def test_a_merge_across_streams_is_refused_on_the_gpu_naming_the_collectives(setting, monkeypatch):
    if not ON_STREAMS:
        codes = native_codes(monkeypatch, two_streams(COLLECTIVES[setting]), *_inputs())
        assert len(codes) == 1 and unwaited_reads(codes[0]) == []
        return
    monkeypatch.setattr(spi, "_gpu", lambda device: True)
    with spi.enabled(), pytest.raises(Exception, match=f"{setting}='all' merges these collectives") as caught:
        torch.compile(two_streams(COLLECTIVES[setting]))(*_inputs())
    assert "(stream 0)" in str(caught.value) and "(stream 1)" in str(caught.value)


def test_on_cpu_the_merge_is_allowed_and_equals_eager(setting):
    fn, inputs = two_streams(COLLECTIVES[setting]), _inputs()
    with spi.enabled(sp.StreamPass(keep_graphs=True)) as p:
        torch.testing.assert_close(torch.compile(fn)(*inputs), fn(*inputs))
    (report,) = p.reports
    assert report.streams == [0, 1] and sp.verify(report.verified_graph).ok


def test_collectives_on_one_stream_merge_on_the_gpu_with_no_unwaited_read(setting, monkeypatch):
    codes = native_codes(monkeypatch, one_stream(COLLECTIVES[setting]), *_inputs())
    assert len(codes) == 1 and "wait_event" in codes[0]
    assert collective_calls(codes[0]) == 1, "torch did not merge the two: this test no longer tests a merge"
    assert unwaited_reads(codes[0]) == []


def test_a_collective_that_reads_another_is_not_refused(setting, monkeypatch):
    """Across streams, but dependent: torch keeps them apart, so StreamPass compiles them."""
    codes = native_codes(monkeypatch, chained(COLLECTIVES[setting]), *_inputs())
    assert len(codes) == 1 and collective_calls(codes[0]) == 2
    assert unwaited_reads(codes[0]) == []


def two_dtypes(x, w, v):
    """An fp32 all-gather on the ambient stream, a bf16 one on a side stream."""
    a = _all_gather(x @ w)
    with sp.stream(1):
        b = _all_gather(v.sin().bfloat16()) * 2
    return a.relu() + b.float()


@pytest.mark.skipif(
    not hasattr(inductor_config, "bucket_all_gathers_bucket_mode"), reason="torch 2.11 has no bucket modes"
)
@pytest.mark.parametrize("mode", ["default", "custom_ops_multidtype"])
def test_all_gathers_of_two_dtypes_merge_only_in_a_multi_dtype_mode(mode, monkeypatch):
    """StreamPass keys collectives as torch does: two dtypes merge only in a multi-dtype mode,
    where (across streams) StreamPass refuses them; otherwise they compile apart."""
    settings = {"bucket_all_gathers_fx": "all", "bucket_all_gathers_bucket_mode": mode}
    refused = ON_STREAMS and mode != "default"
    with inductor_config.patch(settings):
        if refused:
            monkeypatch.setattr(spi, "_gpu", lambda device: True)
            with spi.enabled(), pytest.raises(Exception, match="all_gather_into_tensor \\(stream 0\\)"):
                torch.compile(two_dtypes)(*_inputs())
            return
        codes = native_codes(monkeypatch, two_dtypes, *_inputs())
    assert len(codes) == 1 and unwaited_reads(codes[0]) == []
    assert collective_calls(codes[0]) == (1 if mode != "default" else 2)


@pytest.mark.skipif(not ON_STREAMS, reason="torch 2.11 and 2.12 issue every kernel on one stream: nothing to refuse")
@pytest.mark.parametrize("flags", [("collective_bucketing",), ()], ids=["collective_bucketing", "fsdp_pre_bucketing"])
def test_overlap_schedulings_bucketing_is_refused_too(monkeypatch, flags):
    """Overlap scheduling buckets with the same merge (torch's ``overlap_preserving_bucketer``),
    and by default first merges the collectives of groups with an FSDP-style all-gather; it
    needs triton, but the refusal comes first, in the post-grad custom pass."""
    monkeypatch.setattr(spi, "_gpu", lambda device: True)
    overlap = {f"aten_distributed_optimizations.{k}": True for k in ("enable_overlap_scheduling", *flags)}
    with (
        inductor_config.patch(overlap),
        spi.enabled(),
        pytest.raises(Exception, match="enable_overlap_scheduling=True merges these collectives"),
    ):
        torch.compile(two_streams(_all_reduce))(*_inputs())
    off = {**overlap, "aten_distributed_optimizations.pre_bucketing_fsdp_collectives": False}
    with inductor_config.patch(off):  # with neither, overlap scheduling only reorders
        assert len(collective_buckets.bucketing_flags()) == len(flags)


def test_without_bucketing_nothing_is_refused(monkeypatch):
    assert collective_buckets.bucketing_flags() == {}
    codes = native_codes(monkeypatch, two_streams(_all_reduce), *_inputs())
    assert len(codes) == 1 and unwaited_reads(codes[0]) == []


def three_branches(x, w1, w2, u):
    """Two collectives on independent branches and a third branch: ``assign="auto"`` with the
    H100 profile spreads them over streams."""
    a = _all_reduce((x @ w1).relu() @ w1)
    b = _all_reduce((u @ w2).relu() @ w2)
    c = ((u @ u).relu() @ u).relu() @ u
    return a.relu() @ w1 + b.sigmoid() @ w2 + c


@pytest.mark.parametrize("bucketing", ["none", "all"])
def test_assign_auto_keeps_collectives_that_may_merge_on_one_stream(bucketing, monkeypatch):
    """``assign="auto"`` places collectives inductor's bucketing may merge on one stream, and so
    never makes a graph StreamPass would refuse; without bucketing it spreads them."""
    p = sp.StreamPass(assign="auto", assign_cost="h100", keep_graphs=True)
    with inductor_config.patch(bucket_all_reduces_fx=bucketing):
        codes = native_codes(monkeypatch, three_branches, *(torch.randn(2048, 2048) for _ in range(4)), passes=p)
    (report,) = p.reports
    collectives = [
        n for n in report.verified_graph.graph.nodes if n.target is torch.ops._c10d_functional.all_reduce.default
    ]
    streams = {n.meta.get("custom", {}).get("stream", 0) for n in collectives}
    assert len(collectives) == 2 and len(report.streams) > 1 and len(streams) == (1 if bucketing == "all" else 2)
    assert len(codes) == 1 and unwaited_reads(codes[0]) == []
