"""What a broker takes from the server's settings, made once (busd.config.settings.Settings.
broker_settings) and shared by the default namespace's broker and every other one.

The defaults here are the server's: `busd serve`'s options and `Settings` read them from this
class, so a broker setting's default is written once."""

from __future__ import annotations

from dataclasses import dataclass, field

from busd.broker.limits import Limits


@dataclass(frozen=True)
class BrokerSettings:
    # how often each process runs the lock/TTL/schedule sweep (docs/design.md §3.6)
    sweep_interval_s: float = 1.0
    # what one client may make the process hold (busd/broker/limits.py)
    limits: Limits = field(default_factory=Limits)
    # a transaction is rolled back this long after its first operation (Service Bus: 2 min)
    transaction_timeout_s: float = 120.0
    # faults on demand over the admin API (docs/faults.md): for tests, off unless asked for
    faults: bool = False
