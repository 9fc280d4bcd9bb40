"""``python -m scheduler.cli``: the ``treadle`` command."""

from scheduler.cli.main import main

main()
