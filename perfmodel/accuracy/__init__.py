"""The accuracy cost of gradient staleness: a model fitted on real delayed-gradient runs."""

from perfmodel.accuracy.cost import StalenessCost, for_prediction, staleness_cost
from perfmodel.accuracy.model import AccuracyModel, load_accuracy_model

__all__ = ["AccuracyModel", "StalenessCost", "for_prediction", "load_accuracy_model",
           "staleness_cost"]
