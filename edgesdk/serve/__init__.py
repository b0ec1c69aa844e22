"""``edgesdk serve``: an OpenAI-compatible HTTP server for a bundle, guarded like ``edgesdk run``."""
