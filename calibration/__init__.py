"""Calibration: fit the model's parameters from measurements; holds the shipped profiles."""
