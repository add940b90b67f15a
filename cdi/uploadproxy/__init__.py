"""The upload proxy: the public HTTPS endpoint of uploads (`cdi uploadproxy` on a real cluster,
in-process in `cdi up`). It checks the upload token (`auth.py`), finds the PVC's upload server through
the API (`routing.py`) and streams the upload to it over mutual TLS (`server.py`)."""
