"""Background jobs and real faults under them (specui/jobs/)."""
