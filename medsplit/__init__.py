"""MedSplit core library: cut a model, move what crosses the cut, train split exactly.

This package never imports Django or Celery (see docs/design.md): the coordinator, the
workers and the hospital agent all build on it, and it builds on none of them.
"""

__version__ = "0.1.0"
