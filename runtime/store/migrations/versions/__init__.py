"""Alembic revision files, one per schema change, applied in order."""
