"""treadle's domain package: importable without Celery or a web framework."""
