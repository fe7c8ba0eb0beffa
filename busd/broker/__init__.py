"""Entities, sessions, dispatch and settlement: the broker's rules, on top of the Store API."""
