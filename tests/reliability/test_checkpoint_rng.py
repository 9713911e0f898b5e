"""A checkpoint's RNG file holds the CPU's and every GPU's generator state (issue 26):
a resumed DLRMv4 run draws its dropout masks on the GPU, so the GPUs' states must come
back with the CPU's. Checked on CPU: the field is there, a restore sets every state it
holds, and a file from before (the CPU state alone) still loads."""

from __future__ import annotations

import torch

from dlrmtrain.run.checkpoint import restore_rng_state, rng_state


def test_the_saved_state_carries_the_cpu_and_the_gpu_states(tmp_path):
    state = rng_state()
    assert set(state) == {"cpu", "cuda"}
    assert torch.equal(state["cpu"], torch.get_rng_state())
    expected = torch.cuda.device_count() if torch.cuda.is_available() else 0
    assert len(state["cuda"]) == expected
    torch.save(state, tmp_path / "rng_rank0.pt")
    loaded = torch.load(tmp_path / "rng_rank0.pt")  # weights_only: plain tensors and lists
    assert set(loaded) == {"cpu", "cuda"}


def test_a_restore_continues_the_saved_cpu_stream(tmp_path):
    torch.manual_seed(3)
    torch.save(rng_state(), tmp_path / "rng_rank0.pt")
    expected = torch.rand(5)
    torch.rand(100)  # training moved on
    restore_rng_state(torch.load(tmp_path / "rng_rank0.pt"))
    assert torch.equal(torch.rand(5), expected)


def test_a_restore_sets_every_saved_gpu_state_that_is_visible(monkeypatch):
    """No GPU here: torch.cuda's setters are stood in for, to see what the restore hands them."""
    set_states = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "set_rng_state", lambda s, device: set_states.append((device, s)))
    gpu = [torch.full((16,), i, dtype=torch.uint8) for i in range(3)]  # saved with 3 GPUs visible
    restore_rng_state({"cpu": torch.get_rng_state(), "cuda": gpu})
    assert [d for d, _ in set_states] == [0, 1]
    assert all(torch.equal(s, gpu[d]) for d, s in set_states)


def test_a_checkpoint_from_before_holds_the_cpu_state_alone_and_still_loads(tmp_path, monkeypatch):
    monkeypatch.setattr(torch.cuda, "set_rng_state", lambda *a: (_ for _ in ()).throw(AssertionError("no GPU state")))
    torch.manual_seed(5)
    torch.save(torch.get_rng_state(), tmp_path / "rng_rank0.pt")  # the old format
    expected = torch.rand(4)
    restore_rng_state(torch.load(tmp_path / "rng_rank0.pt"))
    assert torch.equal(torch.rand(4), expected)
