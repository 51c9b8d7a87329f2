"""The SimPy discrete-event model: one module per strategy behind `Strategy` (strategy.py)."""
