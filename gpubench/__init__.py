"""gpubench: find out why your GPU idles during training, and which settings fix it."""

__version__ = "0.1.0"
