"""The daemon's HTTP side: one ASGI application (Starlette under uvicorn, in a thread of the
daemon) that serves the channels' callbacks, Prometheus `/metrics` and, later, the dashboard."""
