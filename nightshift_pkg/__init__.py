"""nightshift: an agent that works the night shift on deep-learning GPU servers."""

__version__ = "0.1.0"
