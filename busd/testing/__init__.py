"""busd in a project's own tests.

    from busd.testing import BusdBroker
    with BusdBroker(config="Config.json") as broker:     # a real busd on free ports
        ... broker.connection_string, broker.admin_connection_string, broker.http_url

`busd.testing.management` makes and removes entities over the management API,
`busd.testing.containers.BusdContainer` runs busd's image with Testcontainers, and
`busd.testing.pytest_plugin` (loaded by pytest once busd is installed) offers all of it as
fixtures. This package imports only the standard library: Testcontainers and the broker itself
are loaded by what needs them.
"""

from busd.testing.broker import BusdBroker, BusdStartError

__all__ = ["BusdBroker", "BusdStartError"]
