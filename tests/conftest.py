"Helpers shared by the test files: comparing buffer states, and a table of corrupted states."
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
