"""The study's findings reproduced with perfmodel: `perfmodel findings` writes report.md,
its figures and findings.csv (default into reports/findings/).

The findings (DESIGN.md): DDP gives 2–3x throughput; FSDP cuts peak memory 4–6x;
asynchronous PS saves up to 28 % of training time against synchronous PS but loses 4–17 %
accuracy; a staleness-mitigating protocol spends its gain on synchronisation.

- predicted.py: sections 1-3 (DDP speedup, FSDP memory, async time saving), predicted on the
  shipped spec-derived a100 and a10g profiles.
- staleness.py: sections 4-5 (accuracy penalty of staleness, mitigated protocols), from the
  fitted accuracy model and the harness runs it was fitted on (perfmodel/data/accuracy/).
- measured.py: sections 6-7, real local runs from the measurement store, and the runs that
  make them (`perfmodel findings --measure`).
- classes.py: section 8, the study's accuracy penalty per workload class at the same epochs
  and at the same wall-clock time (perfmodel/accuracy/penalty.py), model and harness runs.
- records.py: each section's typed record; report.py builds them and writes the report
  (never dropping measured sections); text.py, prose.py and figures.py render it.

This is the validation layer: it imports the core, measure, calibration and compare; none of
them imports it. No torch is imported here; `--measure` runs torch in subprocesses.
"""

from perfmodel.findings.records import Findings
from perfmodel.findings.report import (
    MeasuredSectionsMissingError,
    build_findings,
    check_measured,
    check_out,
    write_findings,
)

__all__ = ["Findings", "MeasuredSectionsMissingError", "build_findings", "check_measured",
           "check_out", "write_findings"]
