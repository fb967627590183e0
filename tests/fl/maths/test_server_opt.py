import math

import numpy as np
import pytest

from exporters.userinput import InputError
from fl.maths.server_opt import ServerOptimizer, fedadam_init, fedadam_step, fedavg_step, mean_update


def test_mean_update_by_hand():
    g = {"w": np.array([1.0, 2.0], np.float32)}
    avg = {"w": np.array([1.5, 2.0], np.float32)}
    assert mean_update(g, avg)["w"].tolist() == [0.5, 0.0]


def test_fedavg_step_by_hand():
    # theta + eta * Delta with eta = 2: [1 + 2 * 0.5, 2 + 2 * (-1)] = [2, 0].
    new = fedavg_step({"w": np.array([1.0, 2.0])}, {"w": np.array([0.5, -1.0])}, 2.0)
    assert new["w"].tolist() == [2.0, 0.0]
    assert new["w"].dtype == np.float32


def test_fedadam_init():
    m = fedadam_init({"w": np.zeros((2, 3))}, tau=1e-3)
    assert (m.m["w"] == 0).all() and m.m["w"].shape == (2, 3)
    assert np.allclose(m.v["w"], 1e-6) and m.step == 0


def test_fedadam_one_and_two_steps_by_hand():
    eta, b1, b2, tau = 0.1, 0.9, 0.99, 1e-3
    theta = {"w": np.array([1.0, 1.0], np.float32)}
    moments = fedadam_init(theta, tau)
    # Step 1, Delta = (0.1, 0.1): m1 = 0.1 * 0.1 = 0.01, v1 = 0.99 * 1e-6 + 0.01 * 0.01 = 1.0099e-4.
    m1 = 0.01
    v1 = 0.99e-6 + 1e-4
    x1 = 1.0 + eta * m1 / (math.sqrt(v1) + tau)  # 1.0905028...
    new, moments = fedadam_step(theta, {"w": np.array([0.1, 0.1])}, moments, eta, b1, b2, tau)
    assert new["w"] == pytest.approx([x1, x1], rel=1e-6)
    assert x1 == pytest.approx(1.0905028, abs=1e-6)
    assert moments.step == 1
    # Step 2, Delta = (-0.2, 0): element 0 m2 = 0.009 - 0.02 = -0.011, v2 = 0.99 v1 + 0.01 * 0.04;
    # element 1 gets no update but still moves by its momentum: m2 = 0.009, v2 = 0.99 v1.
    m2a, v2a = 0.9 * m1 - 0.1 * 0.2, 0.99 * v1 + 0.01 * 0.04
    m2b, v2b = 0.9 * m1, 0.99 * v1
    x2a = x1 + eta * m2a / (math.sqrt(v2a) + tau)
    x2b = x1 + eta * m2b / (math.sqrt(v2b) + tau)
    new2, moments2 = fedadam_step(new, {"w": np.array([-0.2, 0.0])}, moments, eta, b1, b2, tau)
    assert new2["w"] == pytest.approx([x2a, x2b], rel=1e-6)
    assert x2a == pytest.approx(1.0434143, abs=1e-5)
    assert moments2.m["w"] == pytest.approx([m2a, m2b], rel=1e-6)
    assert moments2.step == 2


def test_server_optimizer_fedavg():
    opt = ServerOptimizer("fedavg", 0.5)
    new = opt.step({"w": np.array([1.0])}, {"w": np.array([2.0])})
    assert new["w"].tolist() == [2.0]
    assert opt.state() == {}


def test_server_optimizer_fedadam_resume_equals_uninterrupted():
    theta = {"w": np.array([0.5, -0.5, 2.0], np.float32), "b": np.array([0.0], np.float32)}
    d1 = {"w": np.array([0.1, -0.3, 0.0]), "b": np.array([1.0])}
    d2 = {"w": np.array([-0.2, 0.05, 0.4]), "b": np.array([0.0])}
    straight = ServerOptimizer("fedadam", 0.01)
    want = straight.step(straight.step(theta, d1), d2)

    first = ServerOptimizer("fedadam", 0.01)
    mid = first.step(theta, d1)
    saved = first.state()
    resumed = ServerOptimizer("fedadam", 0.01)
    resumed.load_state(saved)
    got = resumed.step(mid, d2)
    for name in want:
        assert np.array_equal(got[name], want[name])
    assert resumed.state()["step"] == 2


@pytest.mark.parametrize(
    "kwargs",
    [
        {"name": "sgd", "lr": 1.0},
        {"name": "fedavg", "lr": 0.0},
        {"name": "fedadam", "lr": 1.0, "beta1": 1.0},
        {"name": "fedadam", "lr": 1.0, "tau": 0.0},
    ],
)
def test_server_optimizer_rejects_bad_input(kwargs):
    with pytest.raises(InputError):
        ServerOptimizer(**kwargs)
