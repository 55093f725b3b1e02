"Tests for `fastrl_per.learners.recurrent`: shapes, parameter count, batch independence, gradients, bad inputs."
import numpy as np
import pytest
import torch
from torch import nn

from fastrl_per.learners.recurrent import RecurrentQNetwork, recurrent_param_count

DA_PAIRS = [(1, 1), (2, 2), (4, 2), (8, 3), (17, 6), (128, 18)]


def closed_form(d, a):
    return 512 * (d + 130) + 512 * 258 + 8256 + 65 * a


@pytest.mark.parametrize("d,a", DA_PAIRS)
def test_param_count_matches_closed_form_and_module(d, a):
    net = RecurrentQNetwork(d, a)
    n = sum(p.numel() for p in net.parameters())
    assert recurrent_param_count(d, a) == closed_form(d, a) == n
    assert all(p.requires_grad for p in net.parameters())


def test_param_count_known_value():
    # CartPole without velocities: d=2, A=2
    assert recurrent_param_count(2, 2) == 512 * 132 + 512 * 258 + 8256 + 130 == 208_066


def test_architecture_is_two_separate_single_layer_lstms():
    net = RecurrentQNetwork(5, 3)
    lstms = [m for m in net.modules() if isinstance(m, nn.LSTM)]
    assert len(lstms) == 2
    l1, l2 = lstms
    assert (l1.input_size, l1.hidden_size, l1.num_layers, l1.batch_first) == (5, 128, 1, True)
    assert (l2.input_size, l2.hidden_size, l2.num_layers, l2.batch_first) == (128, 128, 1, True)
    assert not l1.bidirectional and not l2.bidirectional
    linears = [m for m in net.modules() if isinstance(m, nn.Linear)]
    assert [(m.in_features, m.out_features) for m in linears] == [(128, 64), (64, 3)]
    assert any(isinstance(m, nn.ReLU) for m in net.modules())
    assert not any(isinstance(m, (nn.Softmax, nn.LogSoftmax)) for m in net.modules())


@pytest.mark.parametrize("B", [1, 3, 16])
@pytest.mark.parametrize("T", [1, 2, 9])
def test_output_shape_windows(B, T):
    torch.manual_seed(0)
    net = RecurrentQNetwork(4, 3)
    q = net(torch.randn(B, T, 4))
    assert q.shape == (B, 3)
    assert q.dtype == torch.float32
    assert torch.isfinite(q).all()


@pytest.mark.parametrize("B", [1, 7])
def test_single_step_is_window_of_length_one(B):
    torch.manual_seed(0)
    net = RecurrentQNetwork(4, 2).eval()
    x = torch.randn(B, 4)
    with torch.no_grad():
        q2, q3 = net(x), net(x[:, None, :])
    assert q2.shape == (B, 2)
    assert torch.equal(q2, q3)


def test_accepts_numpy_observations():
    torch.manual_seed(0)
    net = RecurrentQNetwork(4, 2).eval()
    obs = np.random.default_rng(0).standard_normal((3, 5, 4))  # float64
    with torch.no_grad():
        q = net(obs)
        ref = net(torch.as_tensor(obs, dtype=torch.float32))
    assert q.shape == (3, 2)
    assert torch.equal(q, ref)


def test_output_is_not_a_distribution():
    torch.manual_seed(0)
    net = RecurrentQNetwork(3, 4)
    q = net(torch.randn(8, 5, 3) * 5)
    assert not torch.allclose(q.sum(-1), torch.ones(8))
    assert (q < 0).any()


@pytest.mark.parametrize("pos", [0, 4, 9])
def test_window_independent_of_batch_neighbours(pos):
    torch.manual_seed(123)
    net = RecurrentQNetwork(6, 4).eval()
    win = torch.randn(1, 7, 6)
    others = torch.randn(9, 7, 6) * 3
    batch = torch.cat([others[:pos], win, others[pos:]])
    with torch.no_grad():
        alone = net(win)[0]
        inside = net(batch)[pos]
        # different neighbours, same answer
        inside2 = net(torch.cat([torch.randn(pos, 7, 6), win, torch.randn(3, 7, 6)]))[pos]
    assert torch.allclose(alone, inside, rtol=1e-5, atol=1e-6)
    assert torch.allclose(alone, inside2, rtol=1e-5, atol=1e-6)


def test_hidden_state_reset_every_call():
    torch.manual_seed(0)
    net = RecurrentQNetwork(3, 2).eval()
    a, b = torch.randn(2, 5, 3), torch.randn(2, 5, 3)
    with torch.no_grad():
        first = net(a)
        net(b)  # an unrelated call in between must not change a's values
        again = net(a)
    assert torch.equal(first, again)


def test_only_last_step_matters_through_history():
    # Changing an early step changes the output (the recurrence reads the whole window) ...
    torch.manual_seed(0)
    net = RecurrentQNetwork(3, 2).eval()
    x = torch.randn(1, 6, 3)
    y = x.clone(); y[0, 0] += 1.0
    with torch.no_grad():
        assert not torch.allclose(net(x), net(y))


def test_gradients_reach_both_lstms_and_head():
    torch.manual_seed(0)
    net = RecurrentQNetwork(4, 3)
    x = torch.randn(5, 6, 4, requires_grad=True)
    net(x).pow(2).mean().backward()
    for name, p in net.named_parameters():
        assert p.grad is not None, name
        assert torch.isfinite(p.grad).all(), name
        assert p.grad.abs().sum() > 0, name
    for lstm in (net.lstm1, net.lstm2):
        assert lstm.weight_ih_l0.grad.abs().sum() > 0
        assert lstm.weight_hh_l0.grad.abs().sum() > 0
    # and back to the earliest time step of the input
    assert x.grad[:, 0].abs().sum() > 0


@pytest.mark.parametrize("d,a,bad", [(0, 2, "0"), (-3, 2, "-3"), (4, 0, "0"), (4, -1, "-1"),
                                     (2.5, 2, "2.5"), (4, None, "None")])
def test_bad_sizes_raise(d, a, bad):
    with pytest.raises(ValueError, match=r"obs_dim|n_actions") as e:
        RecurrentQNetwork(d, a)
    assert bad in str(e.value)
    with pytest.raises(ValueError):
        recurrent_param_count(d, a)


@pytest.mark.parametrize("shape", [(5, 8, 3), (5, 8, 5), (5, 3), (2,), (4,), (5, 0, 4), (2, 3, 4, 4), ()])
def test_bad_input_shapes_raise(shape):
    net = RecurrentQNetwork(4, 2)
    with pytest.raises(ValueError) as e:
        net(torch.randn(shape))
    assert str(tuple(shape)) in str(e.value)


def test_empty_batch():
    net = RecurrentQNetwork(4, 2)
    assert net(torch.randn(0, 3, 4)).shape == (0, 2)


# issue 27: the state made explicit, for acting step by step and replaying from a stored state

from hypothesis import given, settings, strategies as st


@settings(max_examples=20, deadline=None)
@given(B=st.integers(1, 4), T=st.integers(1, 9), split=st.integers(0, 9), seed=st.integers(0, 2**16))
def test_unroll_in_two_calls_equals_one_call(B, T, split, seed):
    "Reading a sequence in two calls, the second from the state the first ended in, gives the one call's Q values and state."
    split = min(split, T - 1) + 1 if T > 1 else 1
    torch.manual_seed(seed)
    net = RecurrentQNetwork(3, 2).eval()
    x, s0 = torch.randn(B, T, 3), torch.randn(B, 4, 128) * 0.5
    with torch.no_grad():
        q, s = net.unroll(x, s0)
        q1, s1 = net.unroll(x[:, :split], s0)
        parts = [q1] + ([net.unroll(x[:, split:], s1)[0]] if split < T else [])
        s2 = net.unroll(x[:, split:], s1)[1] if split < T else s1
    assert q.shape == (B, T, 2) and s.shape == (B, 4, 128)
    assert torch.allclose(torch.cat(parts, 1), q, atol=1e-5) and torch.allclose(s2, s, atol=1e-5)


def test_unroll_from_zeros_is_forward_and_the_state_matters():
    torch.manual_seed(0)
    net = RecurrentQNetwork(4, 3).eval()
    x = torch.randn(5, 6, 4)
    with torch.no_grad():
        assert torch.allclose(net.unroll(x)[0][:, -1], net(x), atol=1e-6)
        assert torch.allclose(net.unroll(x, torch.zeros(5, 4, 128))[0], net.unroll(x)[0], atol=1e-6)
        assert not torch.allclose(net.unroll(x, torch.ones(5, 4, 128))[0], net.unroll(x)[0])


def test_unroll_with_lengths_stops_each_sequence_at_its_own_length():
    torch.manual_seed(0)
    net = RecurrentQNetwork(2, 2).eval()
    x, s0, lengths = torch.randn(4, 6, 2), torch.randn(4, 4, 128), torch.tensor([6, 1, 3, 2])
    with torch.no_grad():
        _, packed = net.unroll(x, s0, lengths)
        for i, n in enumerate(lengths.tolist()):
            assert torch.allclose(packed[i], net.unroll(x[i:i + 1, :n], s0[i:i + 1])[1][0], atol=1e-5)


def test_gradients_flow_to_a_given_state():
    net = RecurrentQNetwork(2, 2)
    s0 = torch.zeros(3, 4, 128, requires_grad=True)
    net.unroll(torch.randn(3, 4, 2), s0)[0].sum().backward()
    assert s0.grad.abs().sum() > 0


@pytest.mark.parametrize("shape", [(3, 4, 64), (2, 4, 128), (3, 2, 128), (3, 512)])
def test_bad_state_shapes_raise(shape):
    net = RecurrentQNetwork(2, 2)
    with pytest.raises(ValueError, match=r"\(3, 4, 128\)") as e:
        net.unroll(torch.randn(3, 5, 2), torch.zeros(shape))
    assert str(tuple(shape)) in str(e.value)
