"""The broadcast weight sync's parts: bucket plans, packing, checksums, and a real gloo transfer
group of three processes (a sender streaming a torch module, two receivers)."""

from __future__ import annotations

import multiprocessing as mp

import pytest

from rstar2cli.cluster import weight_sync as ws


def test_buckets_keep_order_and_cut_at_the_byte_limit():
    # float32: a [4, 4] tensor is 64 bytes, [4] is 16, [10, 10] is 400. Limit 100 bytes:
    # a (64) + b (16) = 80 fit; c (64) would make 144 -> new bucket; d (400) alone; e (16) after.
    shapes = [("a", (4, 4)), ("b", (4,)), ("c", (4, 4)), ("d", (10, 10)), ("e", (4,))]
    plan = ws.plan_buckets(shapes, "float32", max_bucket_bytes=100)
    assert [[s.name for s in b] for b in plan.buckets] == [["a", "b"], ["c"], ["d"], ["e"]]
    assert plan.num_tensors == 5 and plan.num_bytes() == 64 + 16 + 64 + 400 + 16
    assert ws.SyncPlan.from_wire(plan.to_wire()) == plan
    bf16 = ws.plan_buckets(shapes, "bfloat16", max_bucket_bytes=100)  # half the bytes
    assert [[s.name for s in b] for b in bf16.buckets] == [["a", "b", "c"], ["d"], ["e"]]


def test_module_plan_lists_tied_parameters_once():
    import torch

    class Tied(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Embedding(8, 4)
            self.head = torch.nn.Linear(4, 8, bias=False)
            self.head.weight = self.embed.weight

    plan = ws.module_plan(Tied(), "float32")
    assert [s.name for b in plan.buckets for s in b] == ["embed.weight"]


def test_pack_unpack_round_trip_casts_to_the_wire_dtype():
    import torch

    tensors = [torch.randn(3, 5), torch.randn(7)]
    plan = ws.plan_buckets([("x", (3, 5)), ("y", (7,))], "bfloat16", 10**6)
    scratch = ws.empty_buffer(30, "bfloat16", "cpu")
    buffer = ws.pack(tensors, plan.buckets[0], scratch)
    assert buffer.dtype == torch.bfloat16 and buffer.shape == (22,)
    assert buffer.data_ptr() == scratch.data_ptr()  # packed in place, no new allocation
    (nx, x), (ny, y) = ws.unpack(buffer, plan.buckets[0])
    assert (nx, ny) == ("x", "y")
    assert torch.equal(x, tensors[0].to(torch.bfloat16)) and torch.equal(y, tensors[1].bfloat16())
    with pytest.raises(ValueError, match="shape"):
        ws.pack([torch.zeros(2, 5), tensors[1]], plan.buckets[0], scratch)


def test_checksum_sees_one_changed_value_and_the_bucket_order():
    import torch

    a, b = torch.randn(100), torch.randn(100)
    changed = a.clone()
    changed[37] = torch.nextafter(changed[37], torch.tensor(1e9))  # one ulp
    assert ws.checksum(a) == ws.checksum(a.clone())
    assert ws.checksum(changed) != ws.checksum(a)
    assert ws.combine([ws.checksum(a), ws.checksum(b)]) != ws.combine(
        [ws.checksum(b), ws.checksum(a)]
    )
    odd = torch.randn(5).bfloat16()  # 10 bytes: one 64-bit word and a 2-byte tail
    flipped = odd.clone()
    flipped[4] = -flipped[4]  # a change in the tail only
    assert ws.checksum(odd) != ws.checksum(flipped)


def test_backend_is_nccl_only_for_distinct_gpus():
    assert ws.transfer_backend(all_on_gpu=True, gpus_shared=False) == "nccl"
    assert ws.transfer_backend(all_on_gpu=True, gpus_shared=True) == "gloo"
    assert ws.transfer_backend(all_on_gpu=False, gpus_shared=False) == "gloo"


def _model():
    import torch

    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))


def _receiver(address: ws.GroupAddress, rank: int, plan_wire: dict, out: mp.Queue) -> None:
    group = ws.open_group(address, rank, timeout_s=60)
    sums: list[int] = []
    # NOTE: numpy arrays travel by value; a torch tensor would travel as a shared-memory file
    # descriptor that the parent can only fetch while this process still lives
    got = {
        n: t.clone().numpy()
        for n, t in ws.receive(group, ws.SyncPlan.from_wire(plan_wire), "cpu", sums)
    }
    out.put((rank, got, ws.combine(sums)))


def test_three_process_gloo_group_delivers_every_tensor_exactly():
    import torch

    model = _model()
    plan = ws.module_plan(model, "float32", max_bucket_bytes=600)  # 4 params -> 3 buckets
    assert len(plan.buckets) == 3
    address = ws.GroupAddress("127.0.0.1", ws.free_port(), 3, "gloo")
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_receiver, args=(address, r, plan.to_wire(), out)) for r in (1, 2)]
    for p in procs:
        p.start()
    try:
        group = ws.open_group(address, 0, timeout_s=60)
        sent = ws.send_module(model, group, plan, zero3=False, device="cpu")
        results = [out.get(timeout=60) for _ in procs]
    finally:
        for p in procs:
            p.join(timeout=30)
    assert sorted(r for r, _, _ in results) == [1, 2]
    for _, got, received in results:
        assert received == sent
        assert got.keys() == dict(model.named_parameters()).keys()
        assert all(
            torch.equal(torch.from_numpy(got[n]), p.detach()) for n, p in model.named_parameters()
        )
    assert ws.send_module(model, None, plan, zero3=False, device="cpu") is None  # non-source rank


def test_the_reload_drops_only_vllms_rotary_cache_warning():
    import importlib.util
    import logging
    from pathlib import Path

    from rstar2cli.engines import vllm_sync_worker as vw

    # vLLM's own reload module logs this very message on this very logger (read, not imported)
    vllm_dir = Path(importlib.util.find_spec("vllm").origin).parent
    layerwise = vllm_dir / "model_executor/model_loader/reload/layerwise.py"
    assert (
        f'logger.warning("{vw.RELOAD_FAILED}", layer.__class__.__name__)' in layerwise.read_text()
    )
    assert vw.RELOAD_LOGGER == "vllm." + str(layerwise.relative_to(vllm_dir))[:-3].replace("/", ".")

    logger, seen = logging.getLogger(vw.RELOAD_LOGGER), []

    class Keep(logging.Handler):
        def emit(self, record):
            seen.append(record.getMessage())

    handler = Keep()
    logger.addHandler(handler)
    try:
        for layer in ("RotaryEmbedding", "Llama3RotaryEmbedding", "QKVParallelLinear"):
            logger.warning(vw.RELOAD_FAILED, layer)
        logger.warning("%s: Delayed processing", "RotaryEmbedding")
    finally:
        logger.removeHandler(handler)
    assert seen == [
        "QKVParallelLinear: Failed to load weights",
        "RotaryEmbedding: Delayed processing",
    ]


def test_probe_runs_when_the_group_is_made():
    """Two members in one process (threads): open_group returns only after rank 0's probe
    value reached rank 1, i.e. the group has carried one broadcast before any sync."""
    import threading

    address = ws.GroupAddress("127.0.0.1", ws.free_port(), 2, "gloo")
    groups: dict[int, object] = {}
    member = threading.Thread(target=lambda: groups.update({1: ws.open_group(address, 1, 30)}))
    member.start()
    groups[0] = ws.open_group(address, 0, timeout_s=30)
    member.join(timeout=30)
    assert sorted(groups) == [0, 1]
    # rank 0 sends 2; a member expecting 3 (a group of another size) is refused
    sender = threading.Thread(target=ws.probe, args=(groups[0], 2, "cpu"))
    sender.start()
    try:
        with pytest.raises(RuntimeError, match=r"received 2, expected 3"):
            ws.probe(groups[1], 3, "cpu")
    finally:
        sender.join(timeout=30)


class _OneTensorTrainers:
    """The trainer side of rl/sync.py's protocol for one tensor, joining a real transfer group."""

    def __init__(self):
        import torch

        self.weights = {"w": torch.arange(4.0)}

    def on_gpu(self) -> bool:
        return True  # as on a GPU node: the backend chosen is NCCL

    def weight_group_address(self, world_size: int, backend: str) -> ws.GroupAddress:
        return ws.GroupAddress("127.0.0.1", ws.free_port(), world_size, backend)

    def join_weight_group(self, address: ws.GroupAddress) -> None:
        ws.open_group(address, 0, timeout_s=30)

    def weight_buckets(self):
        yield list(self.weights.items())


class _DiskEngine:
    """A receiving engine: joins the transfer group for real, records disk-path updates."""

    name = "e0"
    on_gpu = True

    def __init__(self):
        self.updates: list[dict] = []

    def num_weight_receivers(self) -> int:
        return 1

    async def join_weight_group(self, address: ws.GroupAddress, rank_offset: int) -> None:
        import asyncio

        await asyncio.to_thread(ws.open_group, address, rank_offset, 30)

    async def update_weights(self, named_tensors) -> None:
        self.updates.append(dict(named_tensors))


def test_a_transfer_group_that_cannot_be_made_falls_back_to_disk_before_the_first_push(caplog):
    """Both sides are on "GPUs", so the group is NCCL; this torch has none, so making it fails in
    setup() (on a GPU node: a bad interface, a timeout, two members on one GPU), and every
    engine takes the disk path from the first push on."""
    import asyncio

    import torch.distributed as dist

    from rstar2cli.rl.sync import WeightSync

    if hasattr(dist, "ProcessGroupNCCL"):
        pytest.skip("this torch has NCCL; the failure is made by a CPU build")
    trainers, engine = _OneTensorTrainers(), _DiskEngine()
    sync = WeightSync(trainers, [engine])
    asyncio.run(sync.setup(timeout_s=30))
    assert sync.broadcast_engines == []
    assert "no broadcast group (this torch has no NCCL" in caplog.text
    row = asyncio.run(sync.push())
    assert row["weight_sync"] == "disk"
    assert list(engine.updates[0]) == ["w"]
