"""Celery app and thin tasks: parse ids → call shared.engine → map errors → publish."""
