"""``interference evaluate --against``: one measurement's labels and model scored against another's."""
import pytest

from condor_sched.interference.dataset import PairRecord, check_dataset
from condor_sched.interference.model import DEFAULT_EV_THRESHOLD
from condor_sched.interference.compare import compare_measurements, pooled_records
from tests.unit.test_interference import dataset

PROGRAMS = [f"p{i}" for i in range(8)]
SENSITIVE = {"p0", "p1", "p2", "p3", "reporter"}
HEAVY = {"p5", "p6", "p7", "bubble-8m", "bubble-64m"}


def measured(spared=frozenset()):
    """Sensitive programs lose 30% beside heavy ones (and big bubbles), except those ``spared``."""
    def speed(victim, opponent):
        return 0.7 if victim in SENSITIVE - set(spared) and opponent in HEAVY else 1.0
    return check_dataset(dataset(PROGRAMS, speed), "spared-" + "-".join(sorted(spared)))


def test_two_measurements_that_agree_score_every_predictor_perfectly():
    result = compare_measurements(measured(), measured(), DEFAULT_EV_THRESHOLD, 0.5, folds=3, features="probes")["separate"]
    assert result["records"] == 64
    assert result["labels"]["accuracy"] == 1.0 and result["labels"]["false_negative_rate"] == 0.0
    assert result["model"]["accuracy"] == 1.0 and result["model_reverse"]["accuracy"] == 1.0
    assert result["pooled"]["accuracy"] == 1.0 and result["pooled"]["repeats"] == 6


def test_what_the_second_measurement_changed_is_what_the_first_one_gets_wrong():
    result = compare_measurements(measured(), measured(spared={"p0"}), DEFAULT_EV_THRESHOLD, 0.5, folds=3,
                    features="probes")["separate"]
    # the second measures 9 ill-matched records (p1-p3 beside p5-p7); the first calls those and
    # p0's 3 ill-matched: no false negative, 3 of the 55 well-matched records called ill-matched
    assert result["labels"]["false_negative_rate"] == 0.0
    assert result["labels"]["accuracy"] == pytest.approx((1 + 52 / 55) / 2)
    assert result["labels"]["agreement"] == pytest.approx(61 / 64)
    # the model learned on the first measurement makes the first one's mistakes on the second
    assert result["model"]["false_negative_rate"] == 0.0 and result["model"]["accuracy"] < 1.0
    # the other way round p0's records are the false negatives
    assert result["model_reverse"]["false_negative_rate"] == pytest.approx(3 / 12)


def test_pooled_records_take_the_median_of_both_measurements_runs():
    first = [PairRecord("separate", "a", "b", 0.05, 0.1, (0.0, 0.05, 0.3))]
    second = [PairRecord("separate", "a", "b", 0.2, 0.3, (0.2, 0.25, 0.15)),
              PairRecord("separate", "b", "a", 0.1, 0.0, (0.1,))]
    [record] = pooled_records(first, second)
    assert record.ev_runs == (0.0, 0.05, 0.3, 0.2, 0.25, 0.15)
    assert record.ev == pytest.approx(0.175) and record.eo == pytest.approx(0.2)


def test_measurements_of_different_suites_are_refused_by_name():
    other = check_dataset(dataset(PROGRAMS[:-1] + ["q7"], lambda v, o: 1.0), "other")
    with pytest.raises(ValueError, match=r"different suites \(p7, q7 in one only\)"):
        compare_measurements(measured(), other, DEFAULT_EV_THRESHOLD, 0.5, folds=3)
