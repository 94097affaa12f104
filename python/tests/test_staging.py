"""HostStaging (the async saves' host copy), in this process: plain tensors and containers.
DTensor and ShardedTensor staging runs in the multi-process DCP tests (async-twice)."""

from __future__ import annotations

import collections
import gc
import weakref

import torch

from shardpoint._staging import HostStaging


def _state(scale: float, lr: float):
    return {
        "w": torch.arange(12, dtype=torch.float32).reshape(3, 4) * scale,
        "groups": [{"lr": lr, "params": ["w"]}],
        "pair": (torch.ones(2, dtype=torch.int64) * int(scale), "tag"),
        "step": 7,
    }


def test_copies_are_equal_and_independent_of_the_originals():
    state = _state(1.0, 0.1)
    staged = HostStaging().stage(state)
    assert torch.equal(staged["w"], state["w"]) and torch.equal(staged["pair"][0], state["pair"][0])
    assert staged["w"].data_ptr() != state["w"].data_ptr()
    state["w"].add_(100)
    assert staged["w"][0, 0].item() == 0.0
    assert staged["groups"] == [{"lr": 0.1, "params": ["w"]}] and staged["pair"][1] == "tag" and staged["step"] == 7


def test_later_stages_reuse_the_buffers_and_take_current_values():
    staging = HostStaging()
    first = staging.stage(_state(1.0, 0.1))
    pointers = [first["w"].data_ptr(), first["pair"][0].data_ptr()]
    held = staging.nbytes
    second = staging.stage(_state(2.0, 0.05))
    assert [second["w"].data_ptr(), second["pair"][0].data_ptr()] == pointers
    assert staging.nbytes == held == 12 * 4 + 2 * 8
    assert torch.equal(second["w"], torch.arange(12, dtype=torch.float32).reshape(3, 4) * 2)
    assert second["pair"][0].tolist() == [2, 2]
    assert second["groups"][0]["lr"] == 0.05  # objects are the current ones, not the first save's


def test_a_changed_shape_or_dtype_gets_a_new_buffer_and_fewer_tensors_free_the_rest():
    staging = HostStaging()
    staging.stage({"a": torch.zeros(4), "b": torch.zeros(3)})
    a_before = staging._buffers[0].data_ptr()
    staged = staging.stage({"a": torch.ones(5)})
    assert staged["a"].shape == (5,) and torch.equal(staged["a"], torch.ones(5))
    assert len(staging._buffers) == 1 and staging._buffers[0].data_ptr() != a_before
    staged = staging.stage({"a": torch.ones(5, dtype=torch.float64)})
    assert staged["a"].dtype == torch.float64


def test_strides_are_kept_for_dense_tensors_and_views_are_copied_contiguous():
    staging = HostStaging()
    transposed = torch.arange(6.0).reshape(2, 3).t()
    every_other_row = torch.arange(20.0).reshape(10, 2)[::2]
    staged = staging.stage({"t": transposed, "v": every_other_row})
    assert staged["t"].stride() == transposed.stride() and torch.equal(staged["t"], transposed)
    assert staged["v"].is_contiguous() and torch.equal(staged["v"], every_other_row)
    pointers = [b.data_ptr() for b in staging._buffers]
    staging.stage({"t": transposed, "v": every_other_row})
    assert [b.data_ptr() for b in staging._buffers] == pointers  # a view's buffer is reused too


def test_named_tuples_and_gradients_are_left_alone():
    Point = collections.namedtuple("Point", "x y")
    weight = torch.ones(3, requires_grad=True)
    staged = HostStaging().stage({"p": Point(1, 2), "w": weight})
    assert staged["p"] == Point(1, 2)
    assert not staged["w"].requires_grad and torch.equal(staged["w"], torch.ones(3))


def test_the_same_tensors_staged_again_are_copied_with_their_current_values():
    state = _state(1.0, 0.1)
    staging = HostStaging()
    first = staging.stage(state)
    pointers = [first["w"].data_ptr(), first["pair"][0].data_ptr()]
    state["w"].mul_(3)  # the same objects, changed in place, as training does between saves
    state["pair"][0].add_(5)
    second = staging.stage(state)
    assert [second["w"].data_ptr(), second["pair"][0].data_ptr()] == pointers
    assert torch.equal(second["w"], torch.arange(12, dtype=torch.float32).reshape(3, 4) * 3)
    assert second["pair"][0].tolist() == [6, 6]


def test_a_remembered_tensor_with_a_new_shape_or_dtype_under_the_same_object_gets_a_new_buffer():
    w = torch.zeros(4)
    staging = HostStaging()
    staging.stage({"w": w})
    w.data = torch.arange(6.0)  # same Python object, other shape
    staged = staging.stage({"w": w})
    assert staged["w"].shape == (6,) and torch.equal(staged["w"], torch.arange(6.0))
    w.data = torch.arange(6, dtype=torch.float64)  # same object and shape, other dtype
    staged = staging.stage({"w": w})
    assert staged["w"].dtype == torch.float64 and torch.equal(staged["w"], torch.arange(6, dtype=torch.float64))
    w.resize_(2)  # in place
    staged = staging.stage({"w": w})
    assert staged["w"].shape == (2,) and torch.equal(staged["w"], w)


def test_new_tensor_objects_of_the_same_layout_reuse_the_buffers_and_are_copied():
    staging = HostStaging()
    first = staging.stage({"a": torch.zeros(3, 2), "b": torch.zeros(5)})
    pointers = [first["a"].data_ptr(), first["b"].data_ptr()]
    second = staging.stage({"a": torch.ones(3, 2), "b": torch.full((5,), 2.0)})
    assert [second["a"].data_ptr(), second["b"].data_ptr()] == pointers
    assert torch.equal(second["a"], torch.ones(3, 2)) and torch.equal(second["b"], torch.full((5,), 2.0))


def test_the_staging_keeps_no_reference_to_the_state():
    staging = HostStaging()
    state = {"w": torch.ones(1000)}
    staging.stage(state)
    source = weakref.ref(state["w"])
    del state
    gc.collect()
    assert source() is None  # remembered weakly: the caller's tensors are not kept alive


def test_parameters_staged_again_give_buffers_without_gradients():
    weight = torch.nn.Parameter(torch.ones(3))
    staging = HostStaging()
    staging.stage({"w": weight})
    with torch.no_grad():
        weight.mul_(4)
    staged = staging.stage({"w": weight})
    assert not staged["w"].requires_grad and staged["w"].grad_fn is None
    assert torch.equal(staged["w"], torch.full((3,), 4.0))


def test_async_staging_is_complete_when_its_future_is_and_independent_of_later_changes():
    state = _state(1.0, 0.1)
    staging = HostStaging()
    try:
        for scale in (1.0, 2.0):  # the second reuses the first's buffers and walk
            state["w"].copy_(torch.arange(12, dtype=torch.float32).reshape(3, 4) * scale)
            staged = staging.stage_async(state).result()
            state["w"].fill_(-1)  # allowed once the future is done
            assert torch.equal(staged["w"], torch.arange(12, dtype=torch.float32).reshape(3, 4) * scale)
    finally:
        staging.close()


def test_split_cuts_the_bytes_into_shares_of_about_equal_size_covering_every_byte():
    from shardpoint._host_copy import split

    sources = [torch.arange(1000.0), torch.arange(10, dtype=torch.int64), torch.arange(600.0).reshape(20, 30)[:, ::2],
               torch.arange(3000, dtype=torch.float16), torch.tensor(5.0)]
    targets = [torch.empty_like(s) if s.is_contiguous() else torch.empty(s.shape) for s in sources]
    shares = split(targets, sources, 3)
    assert len(shares) == 3
    sizes = [sum(t.numel() * t.element_size() for t in share[0]) for share in shares]
    total = sum(t.numel() * t.element_size() for t in targets)
    assert sum(sizes) == total and max(sizes) - min(sizes) <= 2 * 1200  # the strided view (1200 B) stays whole
    for share_targets, share_sources in shares:  # every piece is a view of its pair's memory
        for t, s in zip(share_targets, share_sources):
            t.copy_(s)
    assert all(torch.equal(t, s) for t, s in zip(targets, sources))


def test_several_copy_threads_stage_the_same_values(monkeypatch):
    import shardpoint._host_copy as host_copy

    monkeypatch.setattr(host_copy, "MIN_SHARE_BYTES", 1024)  # small tensors, several shares
    weight = torch.nn.Parameter(torch.randn(300, 7))
    state = {"w": weight, "v": torch.arange(2000.0).reshape(100, 20)[::3], "h": torch.randn(5000).half(),
             "i": torch.arange(3000), "groups": [{"lr": 0.1}]}
    staging = HostStaging(copy_threads=3)
    try:
        for scale in (1.0, 2.0):  # the second reuses the buffers and the copy threads
            with torch.no_grad():
                weight.mul_(scale)
            staged = staging.stage_async(state).result()
            assert not staged["w"].requires_grad and torch.equal(staged["w"], weight.detach())
            assert all(torch.equal(staged[k], state[k]) for k in ("v", "h", "i")) and staged["groups"] == [{"lr": 0.1}]
    finally:
        staging.close()


def test_default_copy_threads_are_the_cores_per_local_rank(monkeypatch):
    from shardpoint._host_copy import MAX_THREADS, default_threads

    monkeypatch.setattr("os.sched_getaffinity", lambda pid: set(range(16)))
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    assert default_threads() == 4
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "32")
    assert default_threads() == 1
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    assert default_threads() == MAX_THREADS


def test_large_tensors_take_the_engines_streaming_copy_and_views_it_cannot_take_are_copied_too(monkeypatch):
    import shardpoint._host_copy as host_copy

    native = host_copy._native_copy_ranges()
    assert native is not None  # the installed package has its library
    streamed: list = []
    monkeypatch.setattr(host_copy, "_copy_ranges", lambda d, s, n: (streamed.append(sorted(n)), native(d, s, n)))
    z = torch.randn(300_000, dtype=torch.complex64)
    state = {
        "big": torch.randn(512, 1024),  # 2 MiB, contiguous: streamed
        "half": torch.randn(400_000).half(),  # 800 KB of another dtype: streamed
        "t": torch.randn(1024, 512).t(),  # dense but not contiguous: copy_
        "neg": z.conj().imag,  # a view with the negative bit, 1.2 MB: copy_ (its bytes are not the values)
        "conj": z.conj(),  # the conjugate bit: copy_
        "small": torch.randn(100),  # below the threshold: copy_
    }
    staging = HostStaging(copy_threads=1)
    for _ in range(2):  # the second through the remembered walk
        staged = staging.stage(state)
        for key, value in state.items():
            assert torch.equal(staged[key], value), key
        state["big"].add_(1)
    assert streamed == [[800_000, 2 << 20]] * 2  # big and half, twice; the views and the small one not
