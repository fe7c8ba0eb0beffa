"""busd's container image under Testcontainers (testcontainers-python, a test dependency):

    with BusdContainer() as busd:                      # the image `busd`, or:
    with BusdContainer.from_dockerfile(".") as busd:   # built from a checkout's Dockerfile
        ServiceBusClient.from_connection_string(busd.connection_string)

The container runs with its embedded Valkey (nothing persisted outside it), seeded from a
Config.json when one is given (mounted where the Service Bus emulator reads it), with faults
on demand on (BUSD_FAULTS, docs/faults.md; `faults=False`: off), and counts as started once
`GET /health` answers 200.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from testcontainers.core.container import DockerContainer
from testcontainers.core.image import DockerImage
from testcontainers.core.wait_strategies import HttpWaitStrategy

from busd.testing.broker import DEFAULT_KEY, connection_string

AMQP_PORT = 5672
HTTP_PORT = 5300
TLS_PORT = 5671
WS_PORT = 5443
EMULATOR_CONFIG = "/ServiceBus_Emulator/ConfigFiles/Config.json"
STARTUP_TIMEOUT_S = 60


class BusdContainer(DockerContainer):
    """A busd container with its four ports published on free host ports."""

    def __init__(
        self,
        image: str = "busd",
        *,
        config: str | os.PathLike[str] | None = None,
        key: tuple[str, str] = DEFAULT_KEY,
        faults: bool = True,
        **kwargs: Any,
    ) -> None:
        super().__init__(image, **kwargs)
        self.key = key
        self._built: DockerImage | None = None
        self.with_exposed_ports(AMQP_PORT, HTTP_PORT, TLS_PORT, WS_PORT)
        self.with_env("BUSD_SAS_KEY", f"{key[0]}={key[1]}")
        if faults:
            self.with_env("BUSD_FAULTS", "1")
        if config is not None:
            self.with_volume_mapping(str(Path(config).resolve()), EMULATOR_CONFIG, "ro")
        self.waiting_for(
            HttpWaitStrategy(HTTP_PORT, "/health")
            .for_status_code(200)
            .with_startup_timeout(STARTUP_TIMEOUT_S)
        )

    @classmethod
    def from_dockerfile(
        cls, context: str | os.PathLike[str], *, tag: str = "busd:test", **kwargs: Any
    ) -> BusdContainer:
        """A container of the image built from `context` (a busd checkout with its
        Dockerfile) at start; the image is removed again at stop."""
        image = DockerImage(path=str(context), tag=tag)
        container = cls(tag, **kwargs)
        container._built = image
        return container

    def start(self) -> BusdContainer:
        if self._built is not None:
            self._built.build()
        super().start()
        return self

    def stop(self, force: bool = True, delete_volume: bool = True) -> None:
        try:
            super().stop(force, delete_volume)
        finally:
            if self._built is not None:
                self._built.remove()

    def _endpoint(self, port: int, emulator: bool = True) -> str:
        return connection_string(
            self.get_exposed_port(port),
            self.key,
            host=self.get_container_host_ip(),
            emulator=emulator,
        )

    @property
    def connection_string(self) -> str:
        """For the SDKs' clients (AMQP, with the emulator flag)."""
        return self._endpoint(AMQP_PORT)

    @property
    def admin_connection_string(self) -> str:
        """For the SDKs' administration clients (the HTTP port)."""
        return self._endpoint(HTTP_PORT)

    @property
    def http_url(self) -> str:
        return f"http://{self.get_container_host_ip()}:{self.get_exposed_port(HTTP_PORT)}"

    def cert(self) -> bytes:
        """The certificate authority the container's busd made (PEM): what a TLS client must
        trust."""
        result = self.exec(["cat", "/data/busd-ca.pem"])
        if result.exit_code != 0:
            raise RuntimeError(f"no certificate in the container: {result.output!r}")
        return result.output
