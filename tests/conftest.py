"Helpers shared by the test files: comparing buffer states before and after a call that must change nothing."
import numpy as np
import torch


def assert_state_equal(a, b):
    "Every entry of two `state_dict()`s equal: tensors bit for bit, the rest with ==."
    assert set(a) == set(b)
    for k in a:
        if k == 'columns':
            assert (a[k] is None) == (b[k] is None)
            if a[k] is not None:
                assert set(a[k]) == set(b[k])
                for n in a[k]: assert torch.equal(a[k][n], b[k][n]), f"column {n!r} changed"
        elif isinstance(a[k], torch.Tensor):
            assert torch.equal(a[k], b[k]), f"{k!r} changed: {a[k]!r} -> {b[k]!r}"
        else:
            assert a[k] == b[k], f"{k!r} changed: {a[k]!r} -> {b[k]!r}"


def snapshot(obj):
    "The state and the tree leaves (None for a uniform buffer) of a buffer core or of a pipe around one."
    buf = getattr(obj, 'buffer', obj)
    return buf.state_dict(), (buf.tree[:] if hasattr(buf, 'tree') else None)


def assert_unchanged(before, obj):
    "`obj` has the state and tree leaves of `snapshot` `before`."
    state, leaves = before
    buf = getattr(obj, 'buffer', obj)
    assert_state_equal(state, buf.state_dict())
    if leaves is not None: assert np.array_equal(leaves, buf.tree[:]), f"tree leaves changed: {leaves} -> {buf.tree[:]}"
