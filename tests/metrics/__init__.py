"""Comparison metrics, their definitions and CSV exports (specui/metrics/)."""
