"""The HTTP port: one listener for HTTP and HTTPS (server.py), the Service Bus management
(ATOM) API (atom.py over atom_xml.py) and the web dashboard (dashboard.py)."""
