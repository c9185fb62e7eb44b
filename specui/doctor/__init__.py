"""The speculator doctor: why a speculator's acceptance is low, and how to fix it.

``diagnose(folder, verifier)`` runs static checks on the checkpoint's files and
then, when they pass, measures the drafter on a few prompts (``dynamic``), with
``--vllm`` beside a vLLM server (``served``).  The report (``findings``) ranks
findings by severity, causes before symptoms; ``report`` renders and stores it.
"""

from specui.doctor.core import DoctorOptions, diagnose, speculator_folder
from specui.doctor.dynamic import DynamicOptions
from specui.doctor.findings import Finding, Report, Severity
from specui.doctor.report import load_report, report_path, save_report, to_html, to_text

__all__ = [
    "DoctorOptions",
    "DynamicOptions",
    "Finding",
    "Report",
    "Severity",
    "diagnose",
    "load_report",
    "report_path",
    "save_report",
    "speculator_folder",
    "to_html",
    "to_text",
]
