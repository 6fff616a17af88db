"""hvdscale: reproducible Horovod scaling studies of a stress-strain network."""

__version__ = "0.1.0"
