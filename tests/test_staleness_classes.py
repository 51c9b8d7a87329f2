"""The workload classes of issue 16's held-out plan, and the harness on a Task.

Checked: the classes built in measure/staleness_classes.py are the ones the plan
(perfmodel/data/heldout/accuracy_plan.toml, fixed before any run) names, with its optimizer,
rate, warm-up and budget; a Task with zero delay is ordinary training bit for bit (warm-up
included); the warm-up is linear.
"""

from __future__ import annotations

import re

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("sklearn")

from calibration.fit_accuracy_classes import REPO, load_plan, planned_keys  # noqa: E402
from measure.staleness_classes import CLASSES, pointer_labels  # noqa: E402
from measure.staleness_harness import HarnessConfig, plain_sgd, run_harness  # noqa: E402


@pytest.fixture(autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_classes_are_the_plans():
    plan = load_plan()
    v2 = [c["name"] for c in load_plan(V2_PLAN)["classes"]]
    assert list(CLASSES) == [c["name"] for c in plan["classes"]] + [
        n for n in v2 if n not in {c["name"] for c in plan["classes"]}]
    for entry in plan["classes"] + [c for c in load_plan(V2_PLAN)["classes"]
                                    if "optimizer" in c]:
        cls = CLASSES[entry["name"]]
        assert cls.budget_updates == entry["budget_updates"]
        assert cls.lr == float(re.search(r"lr ([0-9.e-]+)", entry["optimizer"]).group(1))
        assert ("adam" if cls.optimizer == "adam" else "momentum 0.9") in entry["optimizer"]
        warmup = re.search(r"first (\d+) updates", entry["schedule"])
        assert cls.warmup_updates == (int(warmup.group(1)) if warmup else 0)
        assert cls.eval_every == entry.get("eval_every", cls.eval_every)


V2_PLAN = REPO / "perfmodel" / "data" / "heldout" / "accuracy_plan_v2.toml"


def test_pointer_labels_point_at_the_named_position():
    x = torch.tensor([[3, 9, 8, 7, 6, 5, 4, 2], [0, 1, 2, 3, 4, 5, 6, 7],
                      [7, 9, 8, 7, 6, 5, 4, 2]])
    # first digit 3 -> position 4; 0 -> position 1; 7 -> 1 + 0 = position 1
    assert pointer_labels(x).tolist() == [6, 1, 9]


def test_plan_run_counts():
    plan = load_plan()
    keys = planned_keys(plan)
    assert len(keys) == len(set(keys)) == 3 + 8 * 2 * 1 + 4 * 2 * 10


@pytest.mark.parametrize("name", ["logreg-tabular", "cnn-digits", "transformer-seq",
                                  "transformer-pointer"])
def test_zero_delay_task_is_ordinary_training_bit_for_bit(name):
    cls = CLASSES[name]
    config = HarnessConfig(updates=4, lr=cls.lr, optimizer=cls.optimizer, warmup_updates=3,
                           eval_every=4, seed=2)
    task = cls.task()
    result = run_harness([0], config, task)
    assert torch.equal(result.final_params, plain_sgd(config, task))
    assert 0.0 <= result.final_accuracy <= 1.0


def test_warmup_is_linear():
    config = HarnessConfig(lr=0.1, warmup_updates=4)
    assert [config.scheduled_lr(v) for v in range(6)] == pytest.approx(
        [0.025, 0.05, 0.075, 0.1, 0.1, 0.1])
    assert HarnessConfig(lr=0.1).scheduled_lr(0) == 0.1
