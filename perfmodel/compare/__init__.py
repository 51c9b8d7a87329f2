"""Predicted against measured: the held-out protocol behind `perfmodel compare` and its report.

- protocol.py: calibration set A (the calibration suite's runs) and the disjoint held-out
  set B of configurations; how each becomes a prediction and a real run's config.
- matching.py: stored runs -> measured summaries (failed runs left out and listed) ->
  predicted-vs-measured rows with their errors.
- report.py: report.md, comparisons.csv and comparisons.json; figures.py: the PNG figures.
- torch_memory.py: PyTorch's own memory estimate (FSDPMemTracker/MemTracker under
  FakeTensorMode) for GPT-size jobs no machine here can run. It imports torch and runs in
  its own process; nothing that `perfmodel predict` imports imports it.
"""
