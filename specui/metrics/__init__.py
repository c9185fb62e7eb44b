"""The metrics package: what the numbers mean, how they are computed over stored runs, and
their CSV (docs/algorithms.md, "Metrics").

    calibration   ECE, AUROC, Brier, temperature scaling, bootstrap intervals (numpy)
    columns       each comparison and step column's label, definition and unit
    confidence    confidence-head scores read from the store, with their labels
    comparison    one row per run (``compare``) plus the Compare tab's chart data
    agreement     do two runs of one drafter draft the same thing (vLLM against local)
    csv           CSV export

What tau, a_k and the acceptance rate mean is ``specui.acceptance``, below the trace and the
store, which use it too.  Import a name from its module (``from specui.metrics.comparison
import compare``): the package itself imports nothing, so one formula does not load the
store readers.
"""
