"""busd over HTTP: its admin API (admin.py) and its management (ATOM) API (atom.py), for the
operator commands (busd.cli) and a project's tests (busd.testing)."""
