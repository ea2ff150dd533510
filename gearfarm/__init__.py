"""gearfarm: a distributed nightly build-and-test farm on Gearman."""

__version__ = "0.1.0"
