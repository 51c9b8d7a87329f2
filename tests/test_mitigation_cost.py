"""What the staleness-mitigating protocols cost in throughput on the shipped profiles
(issue 13: "DC-ASGD and SSP each cost throughput against plain async"), held against
bounds derived from the protocols, not against numbers the simulation printed.

SSP with bound s lets no worker run more than s clocks ahead of the slowest. With one
permanent straggler at speed v among N workers, in a run of W = N x steps mini-batches where
the straggler completes k of them, every other worker completes at most k + s, so
W <= k + (N - 1)(k + s), i.e. k >= (W - (N - 1)s) / N, and the run lasts at least k
straggler steps of at least compute/v each. Hence

    X_ssp <= W * batch / (k_min * compute / v)

an upper bound that ignores all communication. Plain async has no such bound (the fast
workers take the straggler's share), so where async exceeds it SSP must cost throughput.
On identical, jitter-free workers the bound never binds (clocks stay within one of each
other), so SSP equals async there: what SSP costs depends on how unequal the workers are,
which is why the findings report shows it under stragglers and variable step times.
(A tighter bound is not asserted to be slower run by run: unequal workers under FCFS have
list-scheduling anomalies, Graham 1969; s = 0 came out 0.005 % faster than s = 1 on a100.)
"""

from __future__ import annotations

import json

import pytest

from tests.inprocess import run_cli

N, STEPS, V = 8, 100, 0.5
SPEEDS = ",".join(["1"] * (N - 1) + [str(V)])


def predict(cluster: str, *args: str, speeds: str | None = SPEEDS) -> dict:
    argv = ["predict", "--workers", str(N), "--cluster", cluster, "--workload", "resnet50",
            "--steps", str(STEPS), "--jitter", "none", "--json", "--strategy", *args]
    if speeds:
        argv += ["--speed", speeds]
    code, out, err = run_cli(argv)
    assert code == 0, err
    return json.loads(out)


def throughput(cluster: str, *args: str, speeds: str | None = SPEEDS) -> float:
    return predict(cluster, *args, speeds=speeds)["throughput_samples_per_s"]


@pytest.mark.parametrize("cluster", ["a100", "a10g"])
def test_ssp_is_async_on_identical_workers(cluster):
    """The bound never binds when every worker runs at the same rate."""
    plain = throughput(cluster, "async-ps", speeds=None)
    for bound in ("1", "3"):
        assert throughput(cluster, "ssp-ps", "--staleness-bound", bound, speeds=None) == plain


@pytest.mark.parametrize("cluster", ["a100", "a10g"])
@pytest.mark.parametrize("bound", [0, 1, 3])
def test_ssp_with_a_straggler_is_held_below_the_bound_and_below_async(cluster, bound):
    nominal = predict(cluster, "async-ps", speeds=None)
    compute_s = nominal["breakdown"]["compute_s"]       # one nominal worker's compute per step
    batch = nominal["batch_size"]
    total = N * STEPS
    k_min = (total - (N - 1) * bound) / N
    upper = total * batch / (k_min * compute_s / V)

    ssp = throughput(cluster, "ssp-ps", "--staleness-bound", str(bound))
    plain = throughput(cluster, "async-ps")
    assert ssp <= upper * (1 + 1e-9)
    assert plain > upper          # async escapes the bound: SSP costs throughput here
    assert ssp < plain


@pytest.mark.parametrize("cluster", ["a100", "a10g"])
@pytest.mark.parametrize("speeds", [None, SPEEDS])
def test_delay_compensation_never_beats_plain_async(cluster, speeds):
    """DC-ASGD adds server work (three elementwise passes over the shard) and nothing else."""
    dc = throughput(cluster, "async-ps", "--delay-compensation", speeds=speeds)
    assert dc <= throughput(cluster, "async-ps", speeds=speeds) * (1 + 1e-9)



@pytest.mark.parametrize("placement", ["dedicated", "colocated"])
def test_delay_compensation_never_beats_plain_async_beside_a_far_slower_worker(placement):
    """README's recommend example as predict runs it (default steps and jitter): one worker
    at 0.1 among 8, the server beside the workers (colocated) or on a node of its own. Until
    the throughput became each worker's own rate summed (predict.summarise), DC-ASGD came
    out 4 % faster than plain async here (colocated)."""
    def rate(*extra: str) -> float:
        code, out, err = run_cli(["predict", "--cluster", "a100", "--workload", "resnet50",
                                  "--workers", "8", "--stragglers", "1",
                                  "--straggler-speed", "0.1", "--server-placement", placement,
                                  "--json", "--strategy", "async-ps", *extra])
        assert code == 0, err
        return json.loads(out)["throughput_samples_per_s"]

    assert rate("--delay-compensation") <= rate() * (1 + 1e-9)
