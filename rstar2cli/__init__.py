"""rstar2cli."""

__version__ = "0.1.0"
