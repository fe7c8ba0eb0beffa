"""busd: Azure Service Bus sessions semantics over AMQP 1.0, with all state in Redis or Valkey."""

from importlib.metadata import PackageNotFoundError, version

# The installed package's version, which the build takes from git's tags (setuptools-scm,
# pyproject.toml): `busd --version`, /health/detail and busd_build_info all show this one.
try:
    __version__ = version("busd")
except PackageNotFoundError:  # the source tree imported without installing it
    __version__ = "0.0"
