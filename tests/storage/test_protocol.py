"""RedisStore implements every method of the Store protocol with the same parameters."""

from __future__ import annotations

import inspect

import pytest

from busd.storage.api import Store
from busd.storage.redis.store import RedisStore

METHODS = [
    name
    for name, value in vars(Store).items()
    if inspect.isfunction(value) and not name.startswith("_")
]


@pytest.mark.parametrize("name", METHODS)
def test_redis_store_implements_store_method(name):
    ours = getattr(RedisStore, name)
    assert inspect.iscoroutinefunction(ours)
    theirs = inspect.signature(getattr(Store, name))
    assert list(inspect.signature(ours).parameters) == list(theirs.parameters)
    for param in theirs.parameters.values():
        assert inspect.signature(ours).parameters[param.name].default == param.default
