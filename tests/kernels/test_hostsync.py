"""The host-sync counter counts what would stall a GPU's host, and nothing else."""

from __future__ import annotations

import pytest
import torch

from randkv.kernels.hostsync import count_host_syncs, host_to_device


def test_each_kind_of_read_back_counts_once():
    x = torch.arange(6)
    reads = {
        "item": lambda: x[0].item(),
        "tolist": lambda: x.tolist(),
        "numpy": lambda: x.numpy(),
        "aten._local_scalar_dense": lambda: int(x[1]),
        "aten.nonzero": lambda: x.nonzero(),
        "aten.equal": lambda: torch.equal(x, x),
        "aten.index(mask)": lambda: x[x > 2],
        "aten.repeat_interleave": lambda: x.repeat_interleave(x),
    }
    for name, read in reads.items():
        with count_host_syncs() as syncs:
            read()
        assert dict(syncs.counts) == {name: 1}, name
        assert syncs.total == 1


def test_bool_and_float_count_and_inference_mode_is_seen():
    x = torch.arange(4.0)
    with count_host_syncs() as syncs:
        bool(x[1] > 0)
        float(x.sum())
        with torch.inference_mode():
            int(x.max())
            x.tolist()
    assert syncs.total == 4, dict(syncs.counts)


def test_device_to_host_copies_count():
    # Meta tensors stand in for device tensors on a CPU-only machine: the copy is
    # counted before it is attempted (and fails, having no data).
    meta = torch.empty(3, device="meta")
    with count_host_syncs() as syncs:
        with pytest.raises((NotImplementedError, RuntimeError)):
            meta.to("cpu")
        with pytest.raises((NotImplementedError, RuntimeError)):
            torch.empty(3).copy_(meta)
    assert syncs.counts["d2h_copy"] == 2


def test_tensor_work_without_read_back_counts_zero():
    x = torch.arange(10)
    with count_host_syncs() as syncs:
        y = (x * 3 + 1).index_select(0, torch.tensor([1, 2]))
        z = torch.zeros(4, dtype=torch.int64).scatter_(0, torch.tensor([0, 3]), y)
        torch._assert_async(z.sum() > 0)  # a device-side check: no host read on a GPU
        host_to_device(x, "cpu")
        x.repeat_interleave(3)
        torch.tensor([1, 2, 3])
    assert syncs.total == 0, dict(syncs.counts)


def test_methods_are_restored_even_after_an_error():
    before = {name: getattr(torch.Tensor, name) for name in ("tolist", "numpy", "item")}
    with pytest.raises(ZeroDivisionError), count_host_syncs():
        torch.arange(2).tolist()
        raise ZeroDivisionError
    for name, method in before.items():
        assert getattr(torch.Tensor, name) is method
        assert name not in vars(torch.Tensor)
    with count_host_syncs() as syncs:
        pass
    assert syncs.total == 0
    assert torch.arange(3).tolist() == [0, 1, 2]


@pytest.mark.parametrize("pinning", [True, False])
def test_host_to_device_follows_the_pin_memory_setting(monkeypatch, pinning):
    """vLLM can turn pinned memory off; a copy bound for CUDA must then not pin."""
    from randkv.kernels import hostsync

    calls: list[tuple] = []
    monkeypatch.setattr(torch.Tensor, "is_pinned", lambda self: False)
    monkeypatch.setattr(torch.Tensor, "pin_memory", lambda self: calls.append(("pin",)) or self)
    monkeypatch.setattr(
        torch.Tensor, "to", lambda self, device, **kw: calls.append(("to", kw)) or self
    )
    monkeypatch.setattr(hostsync, "_pin_memory", hostsync.pin_memory_enabled())
    hostsync.set_pin_memory(pinning)
    host_to_device(torch.arange(3), "cuda")  # no CUDA needed: the copy is a recorder
    if pinning:
        assert calls == [("pin",), ("to", {"non_blocking": True})]
    else:
        assert calls == [("to", {})]
