"""The upload server: the program of upload pods (`cdi-uploadserver`, `python -m cdi.uploadserver`).

It receives one image over HTTPS from the upload proxy (`server.py`: CDI's endpoints and status
codes), pushes it through the importer's data path (`session.py`: the same detection, validation,
conversion, sizing, preallocation and checksums as an import), and exits when the image is durable
(`main.py`: exit 0 and a termination message, or non-zero with the reason). Configured by
environment variables with CDI's names only (`config.py`).

Beyond CDI: a raw upload cut off in the middle can be resumed from the bytes already on the volume
(`Upload-Offset`, see `cdi.api.upload`), and failures carry a stable reason code.
"""
