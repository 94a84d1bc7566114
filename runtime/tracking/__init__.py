"""Where a job's numbers are mirrored for the teams that already look there (MLflow)."""
