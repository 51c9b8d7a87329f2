"""Predicted against measured: the held-out protocol behind `perfmodel compare` and its report.

- protocol.py: calibration set A (the calibration suite's runs) and the disjoint held-out
  set B of configurations; how each becomes a prediction and a real run's config.
- matching.py: stored runs -> measured summaries (failed runs left out and listed) ->
  predicted-vs-measured rows with their errors.
- report.py: report.md, comparisons.csv and comparisons.json; figures.py: the PNG figures.
- comparison.py: one comparison start to end (what `perfmodel compare` runs); run.py and
  elastic_run.py measure set B and the elastic runs through measure/session.py.
- PyTorch's own memory estimate for GPT-size jobs no machine here can run is
  measure/torch_memory.py (it imports torch and runs in its own process,
  `python -m measure.torch_memory`); summary.py starts it and caches its answer.
"""
