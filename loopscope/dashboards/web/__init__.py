"""The local web dashboard served by ``loopscope ui``.

- :mod:`.api`: the dashboard's data as Python functions returning JSON-ready dicts
  (``overview(store)`` is the main page);
- :mod:`.server`: the standard-library HTTP server (GET only, loopback by default);
- ``static/``: the page itself (HTML, CSS, vanilla JavaScript), shipped in the package.
"""

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8765
