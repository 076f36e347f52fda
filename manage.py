#!/usr/bin/env python
"""Django's command-line utility for the MedSplit coordinator (``python manage.py ...``).

The coordinator's Django project and apps live in ``platform/``, which is put on the path
here. ``platform/`` is not a package (no ``__init__.py``), so ``import platform`` still
finds the standard library's module: a regular module always wins over a folder that
could only be a namespace package.
"""

import os
import sys
from pathlib import Path


def main() -> None:
    platform_dir = str(Path(__file__).resolve().parent / "platform")
    if platform_dir not in sys.path:
        sys.path.insert(0, platform_dir)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "coordinator.settings")
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)


if __name__ == "__main__":
    main()
