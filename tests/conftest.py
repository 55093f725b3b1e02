"Helpers shared by the test files: comparing buffer states before and after a call that must change nothing; training on one torch thread; waiting on a real run."
import json, os, time
from pathlib import Path
import numpy as np
import pytest
import torch

# torch's default build from the registry reports `2.13.0+cu130` as torch.__version__ while its metadata says `2.13.0`; CI
# has the CPU build, so .ci/run runs the version checks again with this variable set to a CUDA build's label
if os.environ.get('FASTRL_PER_TEST_TORCH_LABEL'):
    torch.__version__ = torch.__version__.split('+')[0] + os.environ['FASTRL_PER_TEST_TORCH_LABEL']


def release(version:str) -> str:
    "`version` without its local label: the torch module and its distribution's metadata may differ by it."
    return version.split('+')[0]


def scalars(run_dir) -> dict:
    "Tag → [(step, value)] of the TensorBoard scalars in `run_dir/tb`, as TensorBoard reads them."
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    events = EventAccumulator(str(Path(run_dir) / 'tb')); events.Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()['scalars']}


@pytest.fixture
def one_thread():
    "Torch on one thread, as `fastrl_per train` sets it: the machine is shared, and more threads than free cores makes training many times slower."
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


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
        elif isinstance(a[k], dict): assert_state_equal(a[k], b[k])   # a kind's own state, say
        else:
            assert a[k] == b[k], f"{k!r} changed: {a[k]!r} -> {b[k]!r}"


def snapshot(obj):
    "The state and the tree leaves (None for a uniform buffer) of a buffer or of a pipe around one."
    buf = getattr(obj, 'buffer', obj)
    return buf.state_dict(), (buf.kind[:] if hasattr(buf, 'kind') else None)


def assert_unchanged(before, obj):
    "`obj` has the state and tree leaves of `snapshot` `before`."
    state, leaves = before
    buf = getattr(obj, 'buffer', obj)
    assert_state_equal(state, buf.state_dict())
    if leaves is not None: assert np.array_equal(leaves, buf.kind[:]), f"tree leaves changed: {leaves} -> {buf.kind[:]}"


def assert_refused_unchanged(build, action, contains):
    "`action(build())` raises a `ValueError` whose message has every string of `contains`, and leaves the buffer as it was."
    buf = build() if build else None
    before = snapshot(buf) if buf is not None else None
    with pytest.raises(ValueError) as e:
        action(buf)
    for s in contains: assert s in str(e.value), f"{s!r} not in {str(e.value)!r}"
    if buf is not None: assert_unchanged(before, buf)


def wait_for_saved_steps(proc, run_dir, steps:int, seconds:float=300.):
    "Wait until the run `proc` writes into `run_dir` has saved at least `steps` env steps in its run.json, has ended, or `seconds` have passed."
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and proc.poll() is None:
        try: saved = json.loads((Path(run_dir) / 'run.json').read_text())['env_steps']
        except (OSError, ValueError, KeyError): saved = 0
        if saved >= steps: return
        time.sleep(0.1)


def pytest_configure(config):
    config.addinivalue_line('markers', "slow: a test of a minute or so (a real run on a Ray cluster); `-m 'not slow'` skips them")
