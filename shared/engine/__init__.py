"""The imperative shell around the pure core: claim, call, step, commit, publish.

Celery tasks (``worker/``) and the API (``scheduler/``) call into this package; it talks to
the database through ``shared.store`` and to the broker through an injected ``Publisher``.
"""
