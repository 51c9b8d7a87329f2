"""The staleness harness: delayed gradients exactly as asynchronous SGD applies them.

Theory checked: with staleness τ the update at version v applies the gradient of version
v − τ (Zhang et al. 2016, "Staleness-aware async-SGD"); the staleness-aware rate is
α₀/max(τ, 1) (ibid.); DC-ASGD applies g + λ g⊙g⊙(w_now − w_old) (Zheng et al. 2017). With no
delay the harness must be ordinary SGD, bit for bit.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("sklearn")

from measure.staleness_harness import (  # noqa: E402
    HarnessConfig,
    accuracy_at,
    plain_sgd,
    run_harness,
    staleness_sequence,
)
from measure.training import DataSource, build_model  # noqa: E402
from perfmodel.errors import PerfmodelError  # noqa: E402

UPDATES = 6                 # short runs: the mechanics, not the learning
EXACT = 0.0                 # bitwise: same ops on the same values in the same order
MANUAL_RTOL = 1e-6          # hand-written update vs the harness (fp32, different op order)


@pytest.fixture(autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.parametrize("optimizer,mitigation", [
    ("momentum", "none"), ("momentum", "staleness-aware"), ("momentum", "dc"), ("sgd", "none")])
def test_zero_delay_is_ordinary_sgd_bit_for_bit(optimizer, mitigation):
    config = HarnessConfig(updates=UPDATES, optimizer=optimizer, mitigation=mitigation,
                           eval_every=UPDATES, seed=3)
    result = run_harness([0], config)
    reference = plain_sgd(config)
    assert torch.equal(result.final_params, reference)
    assert float((result.final_params - reference).abs().max()) == EXACT
    assert result.staleness == (0,) * UPDATES and not result.diverged


def _gradients_by_hand(config: HarnessConfig, params_of_update):
    """Flat gradient of each update's batch on the parameters `params_of_update(i)`."""
    spec = config.spec
    with torch.random.fork_rng(devices=[]):
        model = build_model(spec, config.seed, "cpu")
    data = DataSource(spec, config.batch_size, config.seed, 0, "cpu")
    grads = []
    for i in range(config.updates):
        flat = params_of_update(i)
        offset = 0
        with torch.no_grad():
            for p in model.parameters():
                p.copy_(flat[offset:offset + p.numel()].view_as(p))
                offset += p.numel()
        model.zero_grad(set_to_none=True)
        x, y = data.next_batch()
        spec.loss(model(x), y).backward()
        grads.append(torch.cat([p.grad.reshape(-1) for p in model.parameters()]))
    return grads


def _initial(config: HarnessConfig) -> torch.Tensor:
    with torch.random.fork_rng(devices=[]):
        model = build_model(config.spec, config.seed, "cpu")
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def _stale_by_hand(lr: float, rates: list[float]) -> torch.Tensor:
    """τ = 2 throughout, plain SGD, 4 updates: τ is clamped to v, so updates 0, 1, 2 all read
    w0; update 3 reads w1. w_{k+1} = w_k − rate_k · g_k(w read)."""
    config = HarnessConfig(updates=4, optimizer="sgd", lr=lr, eval_every=4)
    w0 = _initial(config)
    g = _gradients_by_hand(config, lambda i: w0)
    w1 = w0 - rates[0] * g[0]
    g3 = _gradients_by_hand(config, lambda i: w1)[3]
    w3 = w1 - rates[1] * g[1] - rates[2] * g[2]
    return w3 - rates[3] * g3


def test_stale_gradient_is_computed_on_the_old_version():
    expected = _stale_by_hand(0.1, [0.1] * 4)
    config = HarnessConfig(updates=4, optimizer="sgd", lr=0.1, eval_every=4)
    result = run_harness([2], config)
    assert result.staleness == (0, 1, 2, 2)
    torch.testing.assert_close(result.final_params, expected, rtol=MANUAL_RTOL, atol=1e-7)
    fresh = run_harness([0], config).final_params
    assert not torch.allclose(fresh, expected, rtol=MANUAL_RTOL, atol=1e-7)


def test_staleness_aware_rate_divides_by_tau():
    # α₀/max(τ, 1): updates with τ = 0, 1, 2, 2 get α₀, α₀, α₀/2, α₀/2 (Zhang et al. 2016).
    expected = _stale_by_hand(0.1, [0.1, 0.1, 0.05, 0.05])
    config = HarnessConfig(updates=4, optimizer="sgd", lr=0.1, mitigation="staleness-aware",
                           eval_every=4)
    result = run_harness([2], config)
    torch.testing.assert_close(result.final_params, expected, rtol=MANUAL_RTOL, atol=1e-7)


def test_delay_compensation_adds_the_dc_asgd_term():
    # DC-ASGD (Zheng et al. 2017): the second update (τ = 1, read w0, applied to w1) uses
    # g + λ g⊙g⊙(w1 − w0). A large λ makes the term visible.
    lam = 50.0
    config = HarnessConfig(updates=2, optimizer="sgd", lr=0.1, mitigation="dc",
                           dc_lambda=lam, eval_every=2)
    w0 = _initial(config)
    g = _gradients_by_hand(config, lambda i: w0)
    w1 = w0 - 0.1 * g[0]
    expected = w1 - 0.1 * (g[1] + lam * g[1] * g[1] * (w1 - w0))
    result = run_harness([1], config)
    torch.testing.assert_close(result.final_params, expected, rtol=MANUAL_RTOL, atol=1e-7)
    plain = run_harness([1], HarnessConfig(updates=2, optimizer="sgd", lr=0.1, eval_every=2))
    assert not torch.allclose(plain.final_params, expected, rtol=MANUAL_RTOL, atol=1e-7)


def test_draws_are_seeded_and_replay_cycles():
    profile = np.array([0, 3, 7, 7, 9])
    a = staleness_sequence(profile, HarnessConfig(updates=50, seed=1))
    b = staleness_sequence(profile, HarnessConfig(updates=50, seed=1))
    c = staleness_sequence(profile, HarnessConfig(updates=50, seed=2))
    assert np.array_equal(a, b) and not np.array_equal(a, c)
    assert set(a.tolist()) <= set(profile.tolist())
    replay = staleness_sequence(profile, HarnessConfig(updates=7, sampling="replay"))
    assert replay.tolist() == [0, 3, 7, 7, 9, 0, 3]


def test_records_accuracy_over_updates():
    result = run_harness([1], HarnessConfig(updates=5, eval_every=2))
    assert result.eval_updates == (0, 2, 4, 5)
    assert all(0.0 <= a <= 1.0 for a in result.accuracy)
    assert accuracy_at(result, 3) == result.accuracy[1]


@pytest.mark.parametrize("profile", [[], [-1], [0.5]])
def test_bad_profiles_are_refused(profile):
    with pytest.raises(PerfmodelError):
        run_harness(profile, HarnessConfig(updates=1))


def test_bad_config_is_refused():
    with pytest.raises(PerfmodelError, match="optimizer"):
        HarnessConfig(optimizer="lbfgs")
    with pytest.raises(PerfmodelError, match="mitigation"):
        HarnessConfig(mitigation="magic")
